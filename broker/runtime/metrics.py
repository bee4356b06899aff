"""Prometheus metrics of one process: one registry, served on its own HTTP port.

Every process has the same families, labelled by what they count:

- ``silbo_messages_in_total{stream}`` / ``silbo_messages_out_total{stream}``: wire messages
- ``silbo_items_in_total{kind}`` / ``silbo_items_out_total{kind}``: updates, notifications...
- ``silbo_queue_depth{link}``: messages waiting on an outbound link
- ``silbo_batch_size{stream}``: items per message
- ``silbo_stage_seconds{stage}``: time spent in one step (matching a batch, holding a batch
  at the exit point, ...)
- ``silbo_subscriptions``: subscriptions held (matchers) or open (connection points)
- ``silbo_http_notifications_total{outcome}``: HTTP notifications (connection points):
  ``delivered``, ``retried`` (attempts after the first), ``gave_up`` (the retry window
  passed), ``dropped`` (a full queue)
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from broker.addresses import parse_address
from broker.errors import InvalidInput

__all__ = ["ProcessMetrics"]

_BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
_SECONDS_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 5)


class ProcessMetrics:
    """The metric families of one process, in a registry of its own."""

    def __init__(self, role: str) -> None:
        self.registry = CollectorRegistry()
        r = self.registry
        self.messages_in = Counter(
            "silbo_messages_in", "wire messages received", ["stream"], registry=r
        )
        self.messages_out = Counter(
            "silbo_messages_out", "wire messages sent", ["stream"], registry=r
        )
        self.items_in = Counter("silbo_items_in", "items received", ["kind"], registry=r)
        self.items_out = Counter("silbo_items_out", "items sent", ["kind"], registry=r)
        self.queue_depth = Gauge(
            "silbo_queue_depth", "messages waiting on an outbound link", ["link"], registry=r
        )
        self.batch_size = Histogram(
            "silbo_batch_size", "items per message", ["stream"], buckets=_BATCH_BUCKETS, registry=r
        )
        self.stage_seconds = Histogram(
            "silbo_stage_seconds", "time spent in a step", ["stage"], buckets=_SECONDS_BUCKETS,
            registry=r,
        )  # fmt: skip
        self.subscriptions = Gauge("silbo_subscriptions", "subscriptions held", registry=r)
        self.retained = Gauge(
            "silbo_retained_batches",
            "batches kept to send again after a failure (updates until delivered; at exit "
            "points, deliveries kept for sessions resumed elsewhere)",
            registry=r,
        )
        self.notifications = Counter(
            "silbo_http_notifications", "HTTP notifications by outcome", ["outcome"], registry=r
        )
        self.info = Gauge("silbo_process_info", "this process", ["role"], registry=r)
        self.info.labels(role=role).set(1)

    def serve(self, listen: str) -> str:
        """Serve the registry over HTTP on ``listen`` (port 0: any); the bound host:port."""
        host, port = parse_address(listen, "--metrics-listen")
        try:
            server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise InvalidInput(f"cannot serve metrics on {listen}: {exc.strerror or exc}") from exc
        return f"{host}:{server.server_address[1]}"

    def totals(self) -> dict[str, float]:
        """Every counter's total (summed over labels), e.g. ``{"items_in:update": 1200}``."""
        found: dict[str, float] = {}
        for family in self.registry.collect():
            if family.type != "counter":
                continue
            for sample in family.samples:
                if not sample.name.endswith("_total"):
                    continue
                label = next(iter(sample.labels.values()), "")
                key = family.name.removeprefix("silbo_") + (f":{label}" if label else "")
                found[key] = found.get(key, 0.0) + sample.value
        return found
