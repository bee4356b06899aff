"""The store writer of ``silbo bench chaos`` and its oracle, against a fake NGSI front that
applies writes in memory and misbehaves as told: what each misbehaviour is counted as."""

from __future__ import annotations

import http.server
import json
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest

from broker.bench.chaos_store import StoreWriter


class _Front:
    """Applies ``op/update`` appends of ``n`` and ``inc`` ($inc) in memory; every third
    write is treated as ``fault`` says."""

    def __init__(self, fault: str) -> None:
        self.entities: dict[str, dict[str, Any]] = {}
        self.writes = 0
        lock = threading.Lock()
        front = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_POST(self) -> None:
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                (entity,) = body["entities"]
                with lock:
                    front.writes += 1
                    odd = front.writes % 3 == 0
                    # an entity's first write is never forgotten: every entity exists (a run
                    # on CI forgot every write of one, and the read-back found 7 of 8)
                    forget = odd and fault == "forget" and entity["id"] in front.entities
                    applies = 0 if forget else 2 if odd and fault == "twice" else 1
                    for _ in range(applies):
                        kept = front.entities.setdefault(
                            entity["id"], {"id": entity["id"], "inc": 0}
                        )
                        kept["n"] = entity["n"]["value"]
                        kept["inc"] += 1
                status = 503 if odd and fault == "refuse-after-apply" else 204
                if odd and fault == "no-answer":
                    self.close_connection = True
                    return
                self.send_response(status)
                self.send_header("Content-Length", "0")
                self.end_headers()

            def do_GET(self) -> None:
                with lock:
                    body = json.dumps(list(front.entities.values())).encode()
                self.send_response(200)
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port: int = self.server.server_address[1]


@pytest.fixture
def front(request: pytest.FixtureRequest) -> Iterator[_Front]:
    served = _Front(request.param)
    thread = threading.Thread(target=served.server.serve_forever, daemon=True)
    thread.start()
    yield served
    served.server.shutdown()
    served.server.server_close()


@pytest.mark.parametrize(
    ("front", "zero", "positive"),
    [
        ("none", ("store_lost", "store_double", "store_short", "refused", "unknown"), ()),
        ("forget", ("store_double", "refused", "unknown"), ("store_short",)),
        ("twice", ("store_lost", "store_short"), ("store_double", "beyond_attempts")),
        (
            "refuse-after-apply",
            ("store_lost", "store_short", "beyond_attempts", "unknown"),
            ("refused", "store_double", "refused_applied"),
        ),
        ("no-answer", ("store_lost", "store_double", "store_short", "refused"), ("unknown",)),
    ],
    indirect=["front"],
)
def test_each_misbehaviour_is_counted_as_what_it_is(
    front: _Front, zero: tuple[str, ...], positive: tuple[str, ...]
) -> None:
    writer = StoreWriter(front.port, rate=400, entities=8)
    writer.start()
    deadline = time.monotonic() + 30
    while writer.sent() < 3 * 8:  # a few writes of every entity
        assert time.monotonic() < deadline, "the writer does not write"
        time.sleep(0.02)
    writer.stop()
    found = writer.check(timeout=5)
    assert found["read"] == found["entities"] == 8 and found["read_error"] is None, found
    assert found["writes"] == front.writes > 8, found
    assert {k: found[k] for k in zero} == dict.fromkeys(zero, 0), found
    assert all(found[k] > 0 for k in positive), found
    assert found["latency_ms"]["p50"] is not None, found
