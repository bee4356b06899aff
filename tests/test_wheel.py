"""The wheel as a user installs it: built from a copy of the tree, installed in a fresh venv,
``silbo demo-engine`` run from there (not from the source tree, whose editable install the
running venv holds)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import sysconfig
import zipfile
from pathlib import Path

import pytest

import broker

pytestmark = pytest.mark.slow

_ROOT = Path(__file__).resolve().parent.parent
_TIMEOUT = 300


def _run(command: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    environment = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONHOME")}
    done = subprocess.run(
        command, cwd=cwd, env=environment, capture_output=True, text=True, timeout=_TIMEOUT
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done


@pytest.fixture(scope="module")
def wheel(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The wheel, built from a copy of the tree (the build writes next to its sources)."""
    source = tmp_path_factory.mktemp("source")
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(_ROOT / name, source / name)
    for package in ("broker", "spark_matcher"):
        shutil.copytree(
            _ROOT / package, source / package, ignore=shutil.ignore_patterns("__pycache__")
        )
    out = tmp_path_factory.mktemp("wheel")
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "wheel",
            "--no-deps",
            "--no-build-isolation",
            "-w",
            str(out),
            ".",
        ],
        cwd=source,
    )
    (built,) = out.glob("silbo-*.whl")
    return built


def test_the_wheel_holds_every_runtime_file(wheel: Path) -> None:
    names = set(zipfile.ZipFile(wheel).namelist())
    for needed in (
        "broker/py.typed",
        "broker/wire/client_pb2.pyi",
        "broker/ngsi/openapi.json",  # GET /v2/openapi.json
        "spark_matcher/log4j2.properties",
        f"silbo-{broker.__version__}.dist-info/licenses/LICENSE",
    ):
        assert needed in names
    packaged = {name for name in names if name.startswith(("broker/", "spark_matcher/"))}
    in_tree = {
        path.relative_to(_ROOT).as_posix()
        for package in ("broker", "spark_matcher")
        for path in (_ROOT / package).rglob("*")
        if path.is_file() and "__pycache__" not in path.parts
    }
    assert in_tree <= packaged, sorted(in_tree - packaged)


def test_silbo_runs_from_the_installed_wheel(wheel: Path, tmp_path: Path) -> None:
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", "--without-pip", str(venv)], cwd=tmp_path)
    python = venv / "bin" / "python"
    purelib = Path(
        _run(
            [str(python), "-c", "import sysconfig; print(sysconfig.get_path('purelib'))"],
            cwd=tmp_path,
        ).stdout.strip()
    )
    _run(
        [
            sys.executable,
            "-m",
            "pip",
            "--python",
            str(python),
            "install",
            "--no-deps",
            "--no-index",
            str(wheel),
        ],
        cwd=tmp_path,
    )
    # the dependencies come from the running venv: its site-packages appended to sys.path by a
    # path line (the .pth files there, the editable install's finder among them, are not run)
    (purelib / "_silbo_test_dependencies.pth").write_text(sysconfig.get_path("purelib") + "\n")
    where = _run([str(python), "-c", "import broker; print(broker.__file__)"], cwd=tmp_path)
    assert Path(where.stdout.strip()) == purelib / "broker" / "__init__.py"
    version = _run([str(venv / "bin" / "silbo"), "--version"], cwd=tmp_path)
    assert version.stdout == f"silbo {broker.__version__}\n"
    demo = _run(
        [
            str(venv / "bin" / "silbo"),
            "demo-engine",
            "--subscriptions",
            "400",
            "--updates",
            "300",
            "--verify",
            "50",
        ],
        cwd=tmp_path,
    )
    assert "verified: 50 updates" in demo.stdout
    assert "0 mismatches" in demo.stdout
