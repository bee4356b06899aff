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

The load signals (broker.runtime.load; docs/autoscaling.md), the same on every layer,
averaged over the last 5 seconds and refreshed every second:

- ``silbo_busy_fraction``: the share of wall time spent working on data-path batches (or
  waiting for ``--max-rate`` tokens), 0 to 1; ``silbo_busy_seconds_total`` its total
- ``silbo_input_rate`` / ``silbo_output_rate``: data-path items taken in / handed on a second
- ``silbo_true_rate``: items taken in per busy second (what the process could take in)
- ``silbo_outbound_queue_depth`` / ``silbo_outbound_queue_age_seconds``: messages waiting
  on the outbound links, and how long the oldest has waited
- ``silbo_max_rate``: the ``--max-rate`` cap (0: none)
- ``silbo_held_back_fraction``: the share of the items in whose publishers had waited for
  room in their publish window (connection points): offered more than the broker takes
"""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, start_http_server

from broker.addresses import parse_address
from broker.errors import InvalidInput
from broker.runtime.load import Load, LoadSample

__all__ = ["ProcessMetrics"]

_BATCH_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000)
_SECONDS_BUCKETS = (0.0001, 0.0005, 0.001, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.5, 1, 5)


class ProcessMetrics:
    """The metric families of one process, in a registry of its own, and its load meter."""

    def __init__(self, role: str, load: Load | None = None) -> None:
        self.load = load or Load()
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
        self.busy_fraction = Gauge(
            "silbo_busy_fraction", "share of wall time working on data-path batches", registry=r
        )
        self.busy_seconds = Counter(
            "silbo_busy_seconds", "seconds spent working on data-path batches", registry=r
        )
        self.input_rate = Gauge("silbo_input_rate", "data-path items in a second", registry=r)
        self.output_rate = Gauge("silbo_output_rate", "data-path items out a second", registry=r)
        self.true_rate = Gauge("silbo_true_rate", "items in per busy second", registry=r)
        self.outbound_depth = Gauge(
            "silbo_outbound_queue_depth", "messages waiting on the outbound links", registry=r
        )
        self.outbound_age = Gauge(
            "silbo_outbound_queue_age_seconds",
            "how long the oldest message waiting on an outbound link has waited",
            registry=r,
        )
        self.max_rate = Gauge("silbo_max_rate", "the --max-rate cap (0: none)", registry=r)
        self.max_rate.set(self.load.max_rate)
        self.held_back = Gauge(
            "silbo_held_back_fraction",
            "share of the items in whose publishers had waited for room in their window",
            registry=r,
        )
        self._busy_shown = 0.0

    def serve(self, listen: str) -> str:
        """Serve the registry over HTTP on ``listen`` (port 0: any); the bound host:port."""
        host, port = parse_address(listen, "--metrics-listen")
        try:
            server, _thread = start_http_server(port, addr=host, registry=self.registry)
        except OSError as exc:
            raise InvalidInput(f"cannot serve metrics on {listen}: {exc.strerror or exc}") from exc
        return f"{host}:{server.server_address[1]}"

    def show_load(self) -> LoadSample:
        """Sample the load and set its gauges (on the event loop: the load is not shared)."""
        sample = self.load.sample()
        self.busy_fraction.set(sample.busy_fraction)
        self.busy_seconds.inc(max(0.0, sample.busy_seconds - self._busy_shown))
        self._busy_shown = max(self._busy_shown, sample.busy_seconds)
        self.input_rate.set(sample.input_rate)
        self.output_rate.set(sample.output_rate)
        self.true_rate.set(sample.true_rate)
        self.outbound_depth.set(sample.queue_depth)
        self.outbound_age.set(sample.queue_age)
        self.held_back.set(sample.held_fraction)
        return sample

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
