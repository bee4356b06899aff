"""ProcessOptions: the listeners a process is given, checked before anything starts."""

from __future__ import annotations

import pytest

from broker.errors import InvalidInput
from broker.runtime.options import ProcessOptions, Role
from broker.runtime.process import _internal


def test_a_connection_point_has_an_internal_listener_on_its_host_by_default() -> None:
    options = ProcessOptions(Role.CONNECTION_POINT, zk="h:1", listen="0.0.0.0:7777")
    assert _internal(options) == ("0.0.0.0:0", "")
    advertised = ProcessOptions(
        Role.CONNECTION_POINT, zk="h:1", listen="0.0.0.0:7777", advertise="cp1.example:7777"
    )
    assert _internal(advertised) == ("0.0.0.0:0", "cp1.example:0")  # the port it gets
    given = ProcessOptions(
        Role.CONNECTION_POINT, zk="h:1", listen="0.0.0.0:7777", internal_listen="10.0.0.5:7700"
    )
    assert _internal(given) == ("10.0.0.5:7700", "")


@pytest.mark.parametrize("role", [Role.MATCHER, Role.ACCESS_POINT, Role.EXIT_POINT])
def test_internal_listen_is_for_connection_points_only(role: Role) -> None:
    with pytest.raises(InvalidInput, match="--internal-listen is for connection points only"):
        ProcessOptions(role, zk="h:1", internal_listen="127.0.0.1:0")


def test_a_bad_internal_listener_is_refused() -> None:
    with pytest.raises(InvalidInput, match="--internal-listen"):
        ProcessOptions(Role.CONNECTION_POINT, zk="h:1", internal_listen="no-port")


def test_history_is_for_context_stores_and_a_bad_retention_is_refused_with_the_rest() -> None:
    with pytest.raises(InvalidInput, match="--history and --history-retention are for context"):
        ProcessOptions(Role.MATCHER, zk="h:1", history=True)
    with pytest.raises(InvalidInput, match=r"needs --store-dir.*raw='1x' is not a duration"):
        ProcessOptions(Role.CONTEXT_STORE, zk="h:1", history_retention="raw=1x")
    store = ProcessOptions(
        Role.CONTEXT_STORE, zk="h:1", store_dir="/s", history=True, history_retention="raw=1d"
    )
    assert store.history
