"""The committed gRPC code in broker/wire/ is exactly what scripts/gen_protos.py makes now."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


def _generator() -> object:
    spec = importlib.util.spec_from_file_location("gen_protos", ROOT / "scripts" / "gen_protos.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_protos"] = module
    spec.loader.exec_module(module)
    return module


def test_every_proto_has_its_generated_modules_committed() -> None:
    generator = _generator()
    protos = generator.proto_files()  # type: ignore[attr-defined]
    assert protos, "no .proto files found"
    for proto in protos:
        stem = ROOT / proto.with_suffix("")
        for suffix in ("_pb2.py", "_pb2.pyi", "_pb2_grpc.py"):
            assert Path(f"{stem}{suffix}").is_file(), f"{stem}{suffix} is missing"


def test_generated_code_is_not_stale(tmp_path: Path) -> None:
    generator = _generator()
    generator.generate(tmp_path)  # type: ignore[attr-defined]
    fresh = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*_pb2*"))
    assert fresh
    stale = [str(p) for p in fresh if (tmp_path / p).read_bytes() != (ROOT / p).read_bytes()]
    assert not stale, f"regenerate with: python scripts/gen_protos.py (stale: {stale})"


def test_a_changed_proto_is_noticed(tmp_path: Path) -> None:
    """The staleness check can fail: a proto edit changes the generated code."""
    generator = _generator()
    protos_copy = tmp_path / "protos"
    for proto in generator.proto_files():  # type: ignore[attr-defined]
        target = protos_copy / proto
        target.parent.mkdir(parents=True, exist_ok=True)
        text = (generator.PROTOS / proto).read_text()  # type: ignore[attr-defined]
        target.write_text(text.replace("message Empty {}", "message Empty { bool x = 1; }"))
    out = tmp_path / "out"
    out.mkdir()
    original = generator.PROTOS  # type: ignore[attr-defined]
    generator.PROTOS = protos_copy  # type: ignore[attr-defined]
    try:
        generator.generate(out)  # type: ignore[attr-defined]
    finally:
        generator.PROTOS = original  # type: ignore[attr-defined]
    changed = out / "broker" / "wire" / "internal_pb2.py"
    assert changed.read_bytes() != (ROOT / "broker" / "wire" / "internal_pb2.py").read_bytes()


@pytest.mark.parametrize("module", ["client_pb2", "internal_pb2"])
def test_proto_package_is_the_python_import_path(module: str) -> None:
    imported = importlib.import_module(f"broker.wire.{module}")
    assert imported.DESCRIPTOR.package == "broker.wire"
    assert imported.DESCRIPTOR.name == f"broker/wire/{module.removesuffix('_pb2')}.proto"
