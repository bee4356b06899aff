"""The ``silbo`` commands that run and operate a cluster (one module per command family)."""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence

from broker.errors import InvalidInput, MissingExtra, SilboError

__all__ = ["standalone", "told"]


def told(prog: str, work: Callable[[], int]) -> int:
    """``work``'s exit status; bad input (InvalidInput, a missing extra) is one line on
    stderr and 2, a failure (any other SilboError) one line and 1."""
    try:
        return work()
    except (InvalidInput, MissingExtra) as exc:
        print(f"{prog}: error: {exc}", file=sys.stderr)
        return 2
    except SilboError as exc:
        print(f"{prog}: failed: {exc}", file=sys.stderr)
        return 1


def standalone(
    prog: str,
    description: str,
    configure: Callable[[argparse.ArgumentParser], None],
    run: Callable[[argparse.Namespace], int],
    argv: Sequence[str] | None,
) -> int:
    """A command on its own: parse ``argv`` (default ``sys.argv[1:]``), run it; 130 when
    interrupted."""
    parser = argparse.ArgumentParser(prog=prog, description=description)
    configure(parser)
    args = parser.parse_args(argv)
    try:
        return run(args)
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
