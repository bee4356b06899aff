"""The ``silbo`` commands that run and operate a cluster (one module per command family)."""
