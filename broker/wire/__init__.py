"""The gRPC wire protocol: generated modules (``*_pb2*``, do not edit; regenerate with
``python scripts/gen_protos.py``) and the conversions between wire and model types."""
