"""The one SparkSession a process uses: built once, configured for matching, kept quiet.

``spark_session()`` starts (or returns) the session. Executors run the interpreter that
runs Silbo (``PYSPARK_PYTHON``), so the verify step can import :mod:`broker`. Spark's console
noise (log lines, progress bars) is off unless ``verbose`` or ``SILBO_SPARK_VERBOSE=1``.

Settings (docs/spark.md has the list): the master (``local[*]`` by default, any Spark master
URL works), driver memory (``SILBO_SPARK_DRIVER_MEMORY``, 4g), shuffle partitions (twice the
default parallelism), and variant parsing that keeps the last of duplicate keys, as Python's
JSON reader does.
"""

from __future__ import annotations

import os
import sys
import threading
from pathlib import Path
from typing import Any

from broker.extras import require

__all__ = ["DEFAULT_MASTER", "spark_session", "stop_session"]

DEFAULT_MASTER = "local[*]"
_LOG_CONFIG = Path(__file__).with_name("log4j2.properties")
_lock = threading.Lock()
_session: Any = None


def _verbose(verbose: bool | None) -> bool:
    return bool(verbose) or os.environ.get("SILBO_SPARK_VERBOSE", "") not in ("", "0")


def spark_session(master: str | None = None, *, verbose: bool | None = None) -> Any:
    """The process's SparkSession, started on first use (later calls return the same one;
    ``master`` only counts for the first)."""
    global _session
    require("spark", "the Spark matcher")
    with _lock:
        if _session is not None:
            return _session
        os.environ.setdefault("PYSPARK_PYTHON", sys.executable)
        os.environ.setdefault("PYSPARK_DRIVER_PYTHON", sys.executable)
        loud = _verbose(verbose)
        if "PYSPARK_SUBMIT_ARGS" not in os.environ:
            memory = os.environ.get("SILBO_SPARK_DRIVER_MEMORY", "4g")
            java = (
                "" if loud else f'--driver-java-options "-Dlog4j2.configurationFile={_LOG_CONFIG}" '
            )
            os.environ["PYSPARK_SUBMIT_ARGS"] = f"--driver-memory {memory} {java}pyspark-shell"
        from pyspark.sql import SparkSession

        master = master or os.environ.get("SILBO_SPARK_MASTER") or DEFAULT_MASTER
        builder = (
            SparkSession.builder.master(master)
            .appName("silbo")
            .config("spark.ui.enabled", "false")
            .config("spark.ui.showConsoleProgress", "true" if loud else "false")
            .config("spark.sql.variant.allowDuplicateKeys", "true")
            .config("spark.sql.adaptive.enabled", "true")
            .config("spark.python.worker.reuse", "true")
            .config("spark.executorEnv.PYSPARK_PYTHON", os.environ["PYSPARK_PYTHON"])
        )
        session = builder.getOrCreate()
        if not loud:
            session.sparkContext.setLogLevel("ERROR")
        parallelism = session.sparkContext.defaultParallelism
        session.conf.set("spark.sql.shuffle.partitions", str(max(2, 2 * parallelism)))
        _session = session
        return session


def stop_session() -> None:
    """Stop the session (the next ``spark_session()`` starts a new one)."""
    global _session
    with _lock:
        if _session is not None:
            _session.stop()
            _session = None
