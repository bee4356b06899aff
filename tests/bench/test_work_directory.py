"""``silbo bench ... --dir``: a directory not there yet is made; one that cannot be is a usage
error (exit 2, one line), not a traceback after the cluster started."""

from __future__ import annotations

from pathlib import Path

import pytest

from broker.cli import build_parser


@pytest.mark.parametrize("bench", ["context", "derived", "store-scale", "storage"])
def test_a_missing_dir_is_made_and_an_impossible_one_refused(
    bench: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    wanted = tmp_path / "a" / "b"
    args = build_parser(["bench", bench]).parse_args(["bench", bench, "--dir", str(wanted)])
    assert args.dir == wanted and wanted.is_dir()
    blocked = tmp_path / "file"
    blocked.write_text("")
    with pytest.raises(SystemExit) as exited:
        build_parser(["bench", bench]).parse_args(["bench", bench, "--dir", str(blocked / "x")])
    assert exited.value.code == 2
    assert "cannot make" in capsys.readouterr().err
