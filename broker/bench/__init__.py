"""Benchmark workloads and the ``silbo bench`` commands."""

from __future__ import annotations

import argparse
from pathlib import Path

__all__ = ["work_directory"]


def work_directory(text: str) -> Path:
    """``--dir``'s type: the directory, made if it is not there yet (a usage error if it
    cannot be)."""
    path = Path(text)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise argparse.ArgumentTypeError(f"cannot make {text}: {exc.strerror or exc}") from None
    return path
