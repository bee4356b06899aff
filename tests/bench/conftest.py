"""Fixtures of the benchmark tests: the process's local SparkSession (``silbo bench spark``)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from spark_matcher.session import spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The process's SparkSession on local[2] (the same one tests/spark uses: it is a
    process singleton, stopped by Spark's own exit hook)."""
    yield spark_session("local[2]")
