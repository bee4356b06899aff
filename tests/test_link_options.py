"""The gRPC options of internal streams: an idle stream must survive its keepalive pings."""

from __future__ import annotations

from broker.runtime.link import CHANNEL_OPTIONS, SERVER_OPTIONS


def test_servers_accept_the_pings_clients_send_on_idle_streams() -> None:
    client, server = dict(CHANNEL_OPTIONS), dict(SERVER_OPTIONS)
    # a client pings every keepalive_time_ms even without data...
    assert client["grpc.http2.max_pings_without_data"] == 0
    # ...and the server accepts pings that often without data, never counting strikes
    assert server["grpc.http2.min_ping_interval_without_data_ms"] < client["grpc.keepalive_time_ms"]
    assert server["grpc.http2.max_ping_strikes"] == 0
    assert server["grpc.keepalive_permit_without_calls"] == 1
