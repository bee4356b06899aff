"""Regenerate the committed gRPC code in broker/wire/ from protos/ (run after any .proto edit).

    python scripts/gen_protos.py [--out DIR]

The .proto package path matches the Python import path, so ``protos/broker/wire/x.proto``
becomes ``broker/wire/x_pb2.py`` (+ ``_pb2.pyi``, ``_pb2_grpc.py``) under ``--out`` (default:
the repository root). tests/wire/test_generated.py regenerates into a temporary directory and
fails when the committed files differ.
"""

from __future__ import annotations

import argparse
import sys
from importlib import resources
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
PROTOS = ROOT / "protos"


def proto_files() -> list[Path]:
    """Every .proto of the tree, sorted (paths relative to protos/)."""
    return sorted(p.relative_to(PROTOS) for p in PROTOS.rglob("*.proto"))


def generate(out: Path) -> None:
    """Generate the Python, type-stub and gRPC modules of every .proto into ``out``."""
    from grpc_tools import protoc

    include = resources.files("grpc_tools") / "_proto"
    args = [
        "protoc",
        f"-I{PROTOS}",
        f"-I{include}",
        f"--python_out={out}",
        f"--pyi_out={out}",
        f"--grpc_python_out={out}",
        *(str(p) for p in proto_files()),
    ]
    status = protoc.main(args)
    if status != 0:
        raise SystemExit(f"protoc failed with status {status}")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=ROOT)
    generate(parser.parse_args().out)
    return 0


if __name__ == "__main__":
    sys.exit(main())
