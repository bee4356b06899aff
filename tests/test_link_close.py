"""Closing a link: while a repair aborts it (the process stops as its peer is given up), and
when its peer is gone (every process of a cluster stopping at once)."""

from __future__ import annotations

import asyncio
import socket
import time

from broker.runtime.link import Link
from broker.runtime.metrics import ProcessMetrics


def _link(address: str) -> Link:
    return Link(
        "peer",
        address,
        "/broker.wire.ExitPoint/Collect",
        b"",
        metrics=ProcessMetrics("exit-point"),
        streaming_response=False,
    )


def test_a_link_aborted_while_it_closes_closes_without_an_error() -> None:
    """close() waits for the stream; abort() cancels it meanwhile: close() returns (it
    raised CancelledError, and a stopping exit point exited 1)."""

    async def scenario() -> None:
        # a peer that takes the connection and never answers: the channel keeps connecting
        with socket.create_server(("127.0.0.1", 0)) as silent:
            link = _link(f"127.0.0.1:{silent.getsockname()[1]}")
            link.start()
            await asyncio.sleep(0.05)
            closing = asyncio.ensure_future(link.close(timeout=5.0))
            await asyncio.sleep(0.2)
            assert not closing.done(), "close() did not wait for the stream"
            link.abort()
            await asyncio.wait_for(closing, 5.0)

    asyncio.run(scenario())


def test_a_link_whose_peer_is_gone_closes_at_once() -> None:
    """Nothing listens where the peer was: the stream waits for a channel that cannot
    connect, and close() does not wait its timeout for it (a cluster's processes stopping
    together took 5 s instead of 0.2 s in one stop of four)."""

    async def scenario() -> float:
        with socket.create_server(("127.0.0.1", 0)) as gone:
            address = f"127.0.0.1:{gone.getsockname()[1]}"
        link = _link(address)
        link.start()
        await link.send(b"queued for a peer that is gone")
        await asyncio.sleep(0.3)
        began = time.monotonic()
        await link.close(timeout=5.0)
        return time.monotonic() - began

    assert asyncio.run(scenario()) < 2.0
