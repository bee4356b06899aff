"""One local SparkSession for every Spark test of the session (cold start ~10 s)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest

from spark_matcher.session import spark_session


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """The process's SparkSession on local[2] (stopped by Spark's own exit hook)."""
    yield spark_session("local[2]")
