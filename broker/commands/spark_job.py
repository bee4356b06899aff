"""What the Spark commands (``silbo replay``, ``silbo backfill``) share: their progress on
stderr, and Spark's errors told in one line.

:class:`Progress` writes a line per step and, while Spark works, the progress of its active
stages (rewritten in place on a terminal, a line every few seconds otherwise).
:func:`from_spark` tells Spark's exceptions (Py4J and PySpark ones of all kinds) from the
others, :func:`spark_cause` gives an error's root cause in one line.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, TextIO

__all__ = ["Progress", "from_spark", "spark_cause"]

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
