"""A matcher's large batches matched on Spark (``silbo run matcher --spark-offload N``).

Off by default. When on, the matcher starts its SparkSession in the background; once it is
up, every batch of at least ``threshold`` updates that arrives outside a scale is matched by
:func:`spark_matcher.open_matcher` (the ``engine`` method unless told otherwise) on a
worker thread, and the matcher goes on with
the results exactly as with its own engine's: the same partial results, to the same exit
points, in the same order (the matcher handles one batch at a time, so nothing overtakes
it). The subscription tables are rebuilt only when the subscriptions change or one of them
expires. If Spark fails, the batch is matched by the engine and the failure is logged: the
broker keeps serving and nothing is lost.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Sequence
from typing import Any

from broker.model.subscription import Subscription
from broker.model.update import ContextUpdate

__all__ = ["Offload"]

_log = logging.getLogger(__name__)


class Offload:
    """Matches a matcher's large batches on Spark (see the module docstring)."""

    def __init__(self, threshold: int, master: str | None = None, method: str = "engine") -> None:
        from spark_matcher import METHODS

        if threshold < 1:
            raise ValueError(f"the offload threshold must be at least 1, got {threshold}")
        if method not in METHODS:
            raise ValueError(f"unknown method {method!r}; expected one of {', '.join(METHODS)}")
        self.threshold = threshold
        self.method = method
        self._master = master
        self._spark: Any = None
        self._matcher: Any = None
        self._version: object = None
        self._failed: str | None = None
        self.batches = 0  # batches matched on Spark so far

    def start(self) -> None:
        """Start the SparkSession on a background thread (a cold start takes ~10 s)."""
        threading.Thread(target=self._start, name="spark-start", daemon=True).start()

    def _start(self) -> None:
        try:
            from spark_matcher.session import spark_session

            self._spark = spark_session(self._master)
            _log.info("Spark is ready for batches of %d updates or more", self.threshold)
        except Exception as exc:  # Spark cannot start: the engine matches everything
            self._failed = f"{type(exc).__name__}: {exc}"
            _log.error("Spark did not start, batches stay on the engine: %s", self._failed)

    def wanted(self, count: int) -> bool:
        """Whether a batch of ``count`` updates goes to Spark (Spark must be up)."""
        return count >= self.threshold and self._spark is not None

    def current(self, version: object, now: float) -> bool:
        """Whether the tables built for subscriptions ``version`` still hold at ``now``."""
        matcher = self._matcher
        return matcher is not None and version == self._version and now < matcher.valid_until

    def match(
        self,
        version: object,
        subscriptions: Sequence[Subscription] | None,
        batch: Sequence[ContextUpdate],
        now: float,
    ) -> list[set[str]]:
        """The matching subscription ids of each update (run on a worker thread).

        ``subscriptions`` is a snapshot of the matcher's subscriptions, taken on its event
        loop, when the tables must be built again (None when :meth:`current` said they
        hold)."""
        from spark_matcher import open_matcher

        started = time.perf_counter()
        if subscriptions is not None:
            if self._matcher is not None:
                self._matcher.close()
                self._matcher = None
            self._matcher = open_matcher(self._spark, subscriptions, method=self.method, now=now)
            self._version = version
        found: list[set[str]] = self._matcher.match(batch, now=now)
        self.batches += 1
        _log.info(
            "matched a batch of %d updates on Spark in %.2f s (%d batches so far)",
            len(batch),
            time.perf_counter() - started,
            self.batches,
        )
        return found
