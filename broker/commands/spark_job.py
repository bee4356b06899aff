"""What the Spark commands (``silbo replay``, ``silbo backfill``) share: their progress on
stderr, Spark's errors told in one line, their exit statuses, and their JSON input files.

:class:`Progress` writes a line per step and, while Spark works, the progress of its active
stages (rewritten in place on a terminal, a line every few seconds otherwise).
:func:`from_spark` tells Spark's exceptions (Py4J and PySpark ones of all kinds) from the
others, :func:`spark_cause` gives an error's root cause in one line. :func:`run_job` runs a
command and gives its exit status (0; 2 for bad input; 1 for failures, Spark's included),
:func:`read_json_file` reads an input file (InputError naming it).
"""

from __future__ import annotations

import json
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TextIO

from broker.commands import told

__all__ = ["Progress", "from_spark", "read_json_file", "run_job", "spark_cause"]

_POLL = 0.5  # seconds between looks at Spark's progress


class Progress:
    """One line per step on ``out``; while Spark works, its jobs' progress (a line rewritten
    in place on a terminal, a line every few seconds otherwise)."""

    def __init__(self, out: TextIO) -> None:
        self._out = out
        self._tty = out.isatty()
        self._started = time.monotonic()

    def step(self, text: str) -> None:
        """Say what is being done now."""
        self._out.write(f"[{time.monotonic() - self._started:6.1f} s] {text}\n")
        self._out.flush()

    @contextmanager
    def spark(self, spark: Any, what: str) -> Iterator[None]:
        """Show the progress of Spark's stages while the block runs."""
        self.step(what)
        done = threading.Event()
        watcher = threading.Thread(
            target=self._watch, args=(spark.sparkContext.statusTracker(), done), daemon=True
        )
        watcher.start()
        try:
            yield
        finally:
            done.set()
            watcher.join()

    def _watch(self, tracker: Any, done: threading.Event) -> None:
        shown, last = "", 0.0
        every = _POLL if self._tty else 5.0
        while not done.wait(_POLL):
            text = _stages(tracker)
            if not text or text == shown or time.monotonic() - last < every:
                continue
            shown, last = text, time.monotonic()
            if self._tty:
                self._out.write(f"\r\x1b[K  {text}")
            else:
                self._out.write(f"  {text}\n")
            self._out.flush()
        if self._tty and shown:
            self._out.write("\r\x1b[K")
            self._out.flush()


def _stages(tracker: Any) -> str:
    """The active stages as ``stage 3: 5/8 tasks``, joined."""
    shown = []
    for stage_id in sorted(tracker.getActiveStageIds()):
        info = tracker.getStageInfo(stage_id)
        if info is not None:
            shown.append(f"stage {stage_id}: {info.numCompletedTasks}/{info.numTasks} tasks")
    return ", ".join(shown)


def from_spark(exc: BaseException) -> bool:
    return type(exc).__module__.split(".")[0] in ("pyspark", "py4j")


def spark_cause(exc: BaseException) -> str:
    """The root cause of a Spark error, in one line."""
    java = getattr(exc, "java_exception", None)
    if java is not None:
        try:
            while java.getCause() is not None:
                java = java.getCause()
            return str(java.toString()).splitlines()[0]
        except Exception:  # the JVM may be gone: fall back on the Python text
            pass
    lines = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not lines:
        return type(exc).__name__
    if "Traceback" in str(exc):  # an error of a Python worker: its last line says what
        return lines[-1]
    return lines[0]


def run_job(
    prog: str, job: Callable[[Progress], int], missing: Callable[[str], str | None] | None = None
) -> int:
    """Run a Spark command's ``job`` with its progress on stderr; the exit status
    (broker.commands.told), Spark's errors too: one line, and 2 if ``missing`` names the
    option at fault (e.g. a path Spark does not find), else 1. Any other exception is a bug
    and propagates."""

    def work() -> int:
        try:
            return job(Progress(sys.stderr))
        except Exception as exc:  # Spark's errors are Py4J and PySpark exceptions of all kinds
            if not from_spark(exc):
                raise
            cause = spark_cause(exc)
            option = missing(cause) if missing is not None else None
            if option is not None:
                print(f"{prog}: error: {option}: {cause}", file=sys.stderr)
                return 2
            print(f"{prog}: Spark failed: {cause}", file=sys.stderr)
            return 1

    return told(prog, work)


def read_json_file(path: Path) -> Any:
    """The JSON value in ``path``; spark_matcher's InputError naming the file (and the line
    of a JSON error) if it cannot be read, is not UTF-8 or is not JSON."""
    from spark_matcher.entities import InputError

    source = str(path)
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except OSError as exc:
        raise InputError(source, 0, "", exc.strerror or str(exc)) from None
    except UnicodeDecodeError as exc:
        raise InputError(source, 0, "", f"not UTF-8 text ({exc.reason})") from None
    except ValueError as exc:
        raise InputError(source, getattr(exc, "lineno", 0), "", f"not JSON: {exc}") from None
