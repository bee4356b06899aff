"""``silbo demo``: the matching core at work, checked against the reference matcher.

It builds the W-IoT workload (Madrid air-quality stations; docs/workloads.md), shows a few
of its subscriptions and one update, indexes the subscriptions in the engine, matches the
updates, and checks the engine's answer for a sample of them against the reference matcher,
which evaluates every subscription plainly. It exits 1 if any answer differs.
"""

from __future__ import annotations

import argparse
import sys
import time
from collections.abc import Sequence

from broker.bench.workloads import iot_subscriptions, iot_updates
from broker.matching.reference import ReferenceMatcher
from broker.model.subscription import Subscription
from broker.model.update import ContextUpdate

__all__ = ["configure", "run"]

_EXAMPLE_KINDS = ("station_alert", "district_range", "type_threshold", "name_equals", "name_prefix")


def _describe_subscription(subscription: Subscription) -> str:
    selector = subscription.entities[0]
    entity = f"id {selector.id}" if selector.id else f"idPattern {selector.id_pattern!r}"
    if selector.type:
        entity += f", type {selector.type}"
    return (
        f"  {subscription.id:<10} {subscription.description:<15} {entity}, "
        f"path {subscription.service_path}\n"
        f"  {'':<10} q: {subscription.q}"
    )


def _describe_update(update: ContextUpdate) -> str:
    values = ", ".join(f"{name}={attr.value!r}" for name, attr in update.attributes.items())
    return (
        f"  {update.entity_id} ({update.entity_type}) tenant {update.tenant!r}, "
        f"path {update.service_path}\n  {values}"
    )


def _examples(subscriptions: Sequence[Subscription]) -> list[Subscription]:
    chosen: list[Subscription] = []
    for kind in _EXAMPLE_KINDS:
        found = next((s for s in subscriptions if s.description == kind), None)
        if found is not None:
            chosen.append(found)
    return chosen


def _first_mismatch(
    updates: Sequence[ContextUpdate], got: Sequence[set[str]], expected: Sequence[set[str]]
) -> str:
    for update, mine, theirs in zip(updates, got, expected, strict=True):
        if mine != theirs:
            return (
                f"  first mismatch: update {update.sequence} ({update.entity_id})\n"
                f"    engine only:    {sorted(mine - theirs)[:10]}\n"
                f"    reference only: {sorted(theirs - mine)[:10]}"
            )
    return ""


def configure(parser: argparse.ArgumentParser) -> None:
    """Add the ``demo`` options to ``parser`` and make it run :func:`run`."""
    parser.add_argument(
        "--subscriptions", "-n", type=int, default=10_000, metavar="N",
        help="W-IoT subscriptions (default 10000)",
    )  # fmt: skip
    parser.add_argument(
        "--updates", "-m", type=int, default=5_000, metavar="M",
        help="updates to match (default 5000)",
    )  # fmt: skip
    parser.add_argument(
        "--verify", type=int, default=300, metavar="K",
        help="updates checked against the reference matcher (default 300)",
    )  # fmt: skip
    parser.add_argument("--seed", type=int, default=1, help="generator seed (default 1)")
    parser.set_defaults(handler=run)


def run(args: argparse.Namespace) -> int:
    """Run the demonstration; 0 if the engine agreed with the reference on every update."""
    if args.subscriptions < 1 or args.updates < 1 or args.verify < 0 or args.seed < 0:
        print("silbo demo: counts must be positive and the seed non-negative", file=sys.stderr)
        return 2
    try:
        from broker.matching.engine import Engine
    except ImportError as exc:
        print(
            f"silbo demo: the indexed engine is not available ({exc}); "
            "broker/matching/engine.py must provide Engine",
            file=sys.stderr,
        )
        return 2

    print(f"W-IoT workload: {args.subscriptions:,} subscriptions, {args.updates:,} updates")
    started = time.perf_counter()
    subscriptions = iot_subscriptions(args.subscriptions, args.seed)
    updates = iot_updates(args.updates, args.seed + 1)
    print(f"generated in {time.perf_counter() - started:.1f} s\n\nSome subscriptions:")
    for subscription in _examples(subscriptions):
        print(_describe_subscription(subscription))
    print(f"\nAn update:\n{_describe_update(updates[0])}\n")

    started = time.perf_counter()
    engine = Engine(subscriptions)
    engine.compact()
    build_s = time.perf_counter() - started
    print(f"engine: indexed {len(engine):,} subscriptions in {build_s:.2f} s")

    now = time.time()
    started = time.perf_counter()
    results = engine.match_batch(updates, now)
    match_s = time.perf_counter() - started
    matches = sum(len(r) for r in results)
    per_update = matches / len(updates)
    print(
        f"engine: matched {len(updates):,} updates in {match_s:.2f} s "
        f"({len(updates) / max(match_s, 1e-9):,.0f} updates/s, {per_update:.1f} matches each, "
        f"{100 * per_update / len(subscriptions):.2f}% of the subscriptions)"
    )

    sample = updates[: args.verify]
    print(f"\nverifying {len(sample):,} updates against the reference matcher ...")
    started = time.perf_counter()
    expected = ReferenceMatcher(subscriptions).match_batch(sample, now)
    reference_s = time.perf_counter() - started
    mismatches = sum(1 for mine, theirs in zip(results, expected, strict=False) if mine != theirs)
    checked = sum(len(r) for r in expected)
    if sample and reference_s > 0 and match_s > 0:
        speedup = (len(updates) / match_s) / (len(sample) / reference_s)
        print(
            f"reference: {len(sample) / reference_s:,.0f} updates/s "
            f"(the engine is {speedup:,.0f}x faster)"
        )
    print(f"\nverified: {len(sample):,} updates, {checked:,} matches, {mismatches} mismatches")
    if mismatches:
        print(_first_mismatch(sample, results[: len(sample)], expected))
        print("FAILED: the engine disagrees with the reference matcher")
        return 1
    print("OK: the engine agrees with the reference matcher on every verified update")
    return 0
