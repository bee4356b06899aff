"""A link closed while a repair aborts it (the process stops as its peer is given up)."""

from __future__ import annotations

import asyncio

from broker.runtime.link import Link
from broker.runtime.metrics import ProcessMetrics


def test_a_link_aborted_while_it_closes_closes_without_an_error() -> None:
    """close() waits for the stream; abort() cancels it meanwhile: close() returns (it
    raised CancelledError, and a stopping exit point exited 1)."""

    async def scenario() -> None:
        link = Link(
            "peer",
            "127.0.0.1:9",  # nothing listens: the stream waits for the channel
            "/broker.wire.ExitPoint/Collect",
            b"",
            metrics=ProcessMetrics("exit-point"),
            streaming_response=False,
        )
        link.start()
        await asyncio.sleep(0.05)
        closing = asyncio.ensure_future(link.close(timeout=5.0))
        await asyncio.sleep(0.05)  # close() waits for the stream
        link.abort()
        await asyncio.wait_for(closing, 5.0)

    asyncio.run(scenario())
