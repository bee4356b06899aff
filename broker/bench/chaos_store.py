"""The context store under ``silbo bench chaos``: entity writes through the NGSI front, and
the oracle that reads them back.

:class:`StoreWriter` writes ``ENTITIES`` entities (``ChaosEntity:0`` ..., type
``ChaosEntity``) through the front at a steady rate: one entity per request
(``POST /v2/op/update``, actionType ``append``), each write setting ``n`` to the entity's
write number (1, 2, ...) and adding 1 to ``inc`` (``{"$inc": 1}``). Each entity is written
by one thread only, so its writes are sequential and the last acknowledged ``n`` is a floor
for the stored one. Every answer is booked per entity:

- 2xx: *acknowledged*: the write must be in the store, once;
- 503: *refused*: the front says it did not take the write (docs/failures.md, promise 2);
- connection refused: *not sent* (the front is down: restarting);
- no answer (timeout, connection reset) or another error: *unknown*: it may have applied.

One entity per request keeps a 503 meaning one thing: a batch spanning partitions on two
stores may be applied on one and refused on the other, answered 503 as a whole.

:meth:`StoreWriter.check` reads every entity back through the front and counts, per entity:
*lost* (missing, or its ``n`` below the last acknowledged one), *double* (``inc`` above
acknowledged + unknown: a write applied twice, or a refused one applied), *short* (``inc``
below acknowledged: an acknowledged increment missing); ``refused_applied`` splits *double*
into the part refused writes can explain (``inc`` at most acknowledged + unknown + refused)
and the rest (``beyond_attempts``: more applies than writes sent). Latency is that of the
acknowledged writes (the front answers after the store and the notification pipeline);
those slower than ``SLOW`` are counted by the second they were sent (``slow_by_second``).

:func:`member_of`, :func:`replaced`, :func:`registered_again` and :func:`serving_again`
read a store's znodes (broker.store.layout): the bench's store faults measure detection and
recovery by them.
"""

from __future__ import annotations

import http.client
import json
import threading
import time
from dataclasses import dataclass
from typing import Any, Final

import numpy as np
from kazoo.client import KazooClient
from kazoo.exceptions import KazooException, NoNodeError

from broker.store.layout import SERVING, STORES, SYNC

__all__ = [
    "ENTITIES",
    "ENTITY_TYPE",
    "StoreWriter",
    "member_of",
    "registered_again",
    "replaced",
    "serving_again",
]

ENTITY_TYPE: Final = "ChaosEntity"
ENTITIES: Final = 200
WRITERS: Final = 4  # threads, each writing its share of the entities in turn
TIMEOUT: Final = 30.0  # seconds a write may take before its outcome is unknown
SLOW: Final = 5.0  # seconds: an acknowledged write this slow is counted by when it was sent


@dataclass
class _Ledger:
    """What one entity's writer was answered."""

    sent: int = 0  # writes sent (the last one's n)
    acked_n: int = 0  # n of the last acknowledged write
    acked: int = 0
    refused: int = 0
    not_sent: int = 0
    unknown: int = 0


class StoreWriter:
    """Writes the chaos entities through the NGSI front and checks them (see the module doc)."""

    def __init__(self, port: int, rate: float, entities: int = ENTITIES) -> None:
        self._port = port
        self._rate = rate
        self._ledgers = [_Ledger() for _ in range(entities)]
        self._latencies: list[float] = []  # seconds, acknowledged writes
        self._slow: dict[int, int] = {}  # second sent (from the start): slow writes
        self._started = 0.0
        self._errors: dict[str, int] = {}  # unknown outcomes by kind
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._threads = [
            threading.Thread(target=self._write_loop, args=(i,), daemon=True, name=f"writer-{i}")
            for i in range(min(WRITERS, entities))
        ]

    def start(self) -> None:
        """Start writing."""
        self._started = time.monotonic()
        for thread in self._threads:
            thread.start()

    def sent(self) -> int:
        """How many writes were sent so far."""
        with self._lock:
            return sum(ledger.sent for ledger in self._ledgers)

    def stop(self) -> None:
        """Stop writing; return once every write sent is answered (or timed out)."""
        self._stop.set()
        for thread in self._threads:
            thread.join(TIMEOUT + 5)

    def check(self, timeout: float = 60.0) -> dict[str, Any]:
        """Read every entity back and count what the store lost or applied twice."""
        stored, read_error = self._read_back(timeout)
        lost = double = short = beyond = refused_applied = 0
        for number, ledger in enumerate(self._ledgers):
            found = stored.get(_entity_id(number))
            n = int(found.get("n", 0)) if found else 0
            inc = int(found.get("inc", 0)) if found else 0
            if ledger.acked and (found is None or n < ledger.acked_n):
                lost += 1
            if inc > ledger.acked + ledger.unknown:
                double += 1
                if inc > ledger.acked + ledger.unknown + ledger.refused:
                    beyond += 1
                else:
                    refused_applied += inc - ledger.acked - ledger.unknown
            if inc < ledger.acked:
                short += 1
        latencies = np.asarray(self._latencies, dtype=np.float64) * 1000.0
        return {
            "entities": len(self._ledgers),
            "rate": self._rate,
            "writes": sum(ledger.sent for ledger in self._ledgers),
            "acknowledged": sum(ledger.acked for ledger in self._ledgers),
            "refused": sum(ledger.refused for ledger in self._ledgers),
            "not_sent": sum(ledger.not_sent for ledger in self._ledgers),
            "unknown": sum(ledger.unknown for ledger in self._ledgers),
            "unknown_by_kind": dict(sorted(self._errors.items())),
            "read": len(stored),
            "read_error": read_error,
            "store_lost": lost,
            "store_double": double,
            "store_short": short,
            "refused_applied": refused_applied,
            "beyond_attempts": beyond,
            "slow_by_second": dict(sorted(self._slow.items())),
            "latency_ms": {
                "p50": _percentile(latencies, 50),
                "p99": _percentile(latencies, 99),
                "max": _percentile(latencies, 100),
            },
        }

    # -- writing ----------------------------------------------------------------------------

    def _write_loop(self, index: int) -> None:
        owned = list(range(index, len(self._ledgers), len(self._threads)))
        pace = len(self._threads) / self._rate
        connection: http.client.HTTPConnection | None = None
        next_at = time.monotonic()
        turn = 0
        while not self._stop.is_set():
            number = owned[turn % len(owned)]
            turn += 1
            if connection is None:
                connection = http.client.HTTPConnection("127.0.0.1", self._port, timeout=TIMEOUT)
            if not self._write(connection, number):
                connection.close()
                connection = None
            next_at = max(next_at + pace, time.monotonic() - 1.0)  # no burst after a stall
            time.sleep(max(0.0, next_at - time.monotonic()))
        if connection is not None:
            connection.close()

    def _write(self, connection: http.client.HTTPConnection, number: int) -> bool:
        """One write of entity ``number``, booked; False if the connection must be replaced."""
        ledger = self._ledgers[number]
        ledger.sent += 1
        n = ledger.sent
        body = {
            "actionType": "append",
            "entities": [
                {
                    "id": _entity_id(number),
                    "type": ENTITY_TYPE,
                    "n": {"type": "Number", "value": n},
                    "inc": {"type": "Number", "value": {"$inc": 1}},
                }
            ],
        }
        began = time.monotonic()
        try:
            connection.request(
                "POST",
                "/v2/op/update",
                body=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"},
            )
            answer = connection.getresponse()
            answer.read()
        except ConnectionRefusedError:  # nothing reached the front
            with self._lock:
                ledger.not_sent += 1
            return False
        except (OSError, http.client.HTTPException) as exc:  # timeouts, resets: unknown
            self._book_unknown(ledger, type(exc).__name__)
            return False
        took = time.monotonic() - began
        if 200 <= answer.status < 300:
            with self._lock:
                ledger.acked += 1
                ledger.acked_n = n
                self._latencies.append(took)
                if took > SLOW:
                    second = int(began - self._started)
                    self._slow[second] = self._slow.get(second, 0) + 1
        elif answer.status == 503:
            with self._lock:
                ledger.refused += 1
        else:  # not a refusal the front promises nothing was applied for
            self._book_unknown(ledger, f"HTTP {answer.status}")
        return not answer.will_close

    def _book_unknown(self, ledger: _Ledger, kind: str) -> None:
        with self._lock:
            ledger.unknown += 1
            self._errors[kind] = self._errors.get(kind, 0) + 1

    # -- reading ----------------------------------------------------------------------------

    def _read_back(self, timeout: float) -> tuple[dict[str, dict[str, Any]], str | None]:
        """Every chaos entity (id -> keyValues), read through the front; tried again until
        ``timeout`` (the store may still be recovering)."""
        deadline = time.monotonic() + timeout
        path = f"/v2/entities?type={ENTITY_TYPE}&limit=1000&options=keyValues&attrs=n,inc"
        error = "not read"
        while time.monotonic() < deadline:
            connection = http.client.HTTPConnection("127.0.0.1", self._port, timeout=TIMEOUT)
            try:
                connection.request("GET", path)
                answer = connection.getresponse()
                body = answer.read()
                if answer.status == 200:
                    return {e["id"]: e for e in json.loads(body)}, None
                error = f"HTTP {answer.status}: {body[:200]!r}"
            except (OSError, http.client.HTTPException, ValueError) as exc:
                error = f"{type(exc).__name__}: {exc}"
            finally:
                connection.close()
            time.sleep(0.5)
        return {}, error


def member_of(client: KazooClient, store_id: str) -> str | None:
    """The member holding ``store_id``'s registration (``/stores/<id>``), None if it has
    none; KazooException if ZooKeeper does not answer."""
    try:
        data, _stat = client.get(f"{STORES}/{store_id}")
    except NoNodeError:
        return None
    return str(json.loads(data).get("member", ""))


def replaced(client: KazooClient, store_id: str, member: str) -> bool:
    """Is ``store_id``'s registration gone, or held by another member than ``member`` (the
    store's process was fenced, or is dead)? False while ZooKeeper does not answer."""
    try:
        return member_of(client, store_id) != member
    except (KazooException, ValueError):
        return False


def registered_again(client: KazooClient, store_id: str, member: str) -> bool:
    """Is ``store_id`` registered by another member than ``member`` (its replacement
    started; it may still be recovering)? False while ZooKeeper does not answer."""
    try:
        return member_of(client, store_id) not in (None, member)
    except (KazooException, ValueError):
        return False


def serving_again(client: KazooClient, store_id: str, member: str) -> bool:
    """Is ``store_id`` registered by another member than ``member``, serving, and in the
    in-sync set (it recovered)? False while ZooKeeper does not answer."""
    try:
        data, _stat = client.get(f"{STORES}/{store_id}")
        body = json.loads(data)
        return (
            body.get("member") != member
            and body.get("state") == SERVING
            and client.exists(f"{SYNC}/{store_id}") is not None
        )
    except (KazooException, ValueError, AttributeError):
        return False


def _entity_id(number: int) -> str:
    return f"{ENTITY_TYPE}:{number}"


def _percentile(values: Any, q: float) -> float | None:
    return round(float(np.percentile(values, q)), 1) if len(values) else None
