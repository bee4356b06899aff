"""The liveness prober against real gRPC servers: a silent target is reported after
``hang_after`` and not before, once, and again only after it answered in between."""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from concurrent import futures
from typing import Any

import grpc

from broker.runtime.liveness import Prober, Target
from broker.wire import internal_pb2 as wire
from broker.wire import internal_pb2_grpc as wire_grpc


class _Admin(wire_grpc.AdminServicer):
    def __init__(self) -> None:
        self.hung = threading.Event()
        self.resumed = threading.Event()
        self.calls = 0  # probes received
        self.answered = 0  # probes answered while not hung

    def Status(self, request: wire.StatusRequest, context: Any) -> wire.ProcessStatus:
        self.calls += 1
        if self.hung.is_set():
            self.resumed.wait(5)
        else:
            self.answered += 1
        return wire.ProcessStatus(name="target")


def _until(condition: Callable[[], bool], timeout: float = 10.0) -> None:
    """Poll ``condition`` until it holds (AssertionError after ``timeout`` seconds)."""
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, "not within the deadline"
        time.sleep(0.02)


def test_a_silent_target_is_reported_once_after_hang_after_and_again_after_answering() -> None:
    admin = _Admin()
    server, address = _serve(admin)
    reports: list[tuple[str, float, float]] = []
    target = Target("t", "matcher", "target", address)
    hung_at = [0.0]

    def silent(found: Target, silent_s: float) -> bool:
        reports.append((found.name, silent_s, time.monotonic() - hung_at[0]))
        return True

    prober = Prober(lambda: [target], silent, hang_after=1.0)
    try:
        _until(lambda: admin.answered >= 8)  # over 1.5 s of rounds
        assert reports == []  # answering: never reported
        hung_at[0] = time.monotonic()
        admin.resumed.clear()
        admin.hung.set()
        _until(lambda: len(reports) >= 1)
        _name, silent_s, after = reports[0]
        assert silent_s >= 1.0 and after < 3.0  # after hang_after, within a probe round or so
        calls = admin.calls
        _until(lambda: admin.calls >= calls + 3)  # more silent rounds
        assert len(reports) == 1, reports  # once, however long it stays silent
        admin.hung.clear()
        admin.resumed.set()
        answered = admin.answered
        _until(lambda: admin.answered > answered)  # it answers again
        hung_at[0] = time.monotonic()
        admin.resumed.clear()
        admin.hung.set()
        _until(lambda: len(reports) >= 2)
        assert len(reports) == 2, reports  # a new silence is a new report
    finally:
        admin.resumed.set()
        prober.close()
        server.stop(0)


def test_a_target_that_never_answered_gets_the_starting_grace() -> None:
    reports: list[Target] = []
    nowhere = Target("n", "matcher", "nowhere", "127.0.0.1:1")  # nothing listens

    def silent(found: Target, _silent_s: float) -> bool:
        reports.append(found)
        return True

    prober = Prober(lambda: [nowhere], silent, hang_after=0.5)
    try:
        time.sleep(2.0)  # 4 times hang_after, with nobody answering
        assert reports == []  # still starting, as far as the prober knows
    finally:
        prober.close()


def _serve(admin: _Admin) -> tuple[grpc.Server, str]:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    wire_grpc.add_AdminServicer_to_server(admin, server)  # type: ignore[no-untyped-call]
    port = server.add_insecure_port("127.0.0.1:0")
    server.start()
    return server, f"127.0.0.1:{port}"


def test_a_starved_prober_counts_no_silence_and_two_silent_at_once_are_left_alone() -> None:
    admins = [_Admin(), _Admin()]
    served = [_serve(a) for a in admins]
    targets = [Target(i, "matcher", f"m{i}", address) for i, (_s, address) in enumerate(served)]
    reports: list[str] = []

    def silent(found: Target, _silent_s: float) -> bool:
        reports.append(found.name)
        return True

    # rounds driven by the test
    alone = Prober(lambda: targets[:1], silent, hang_after=1.0, interval=3600.0)
    together = Prober(lambda: targets, silent, hang_after=1.0, one_at_a_time=True, interval=3600.0)
    try:
        alone.probe_once()
        together.probe_once()  # both answer
        for admin in admins:
            admin.hung.set()
        alone.probe_once()  # one failure
        time.sleep(2.0)  # the prober starved: the silence so far is not counted
        alone.probe_once()  # one failure since the clocks restarted
        assert reports == []
        alone.probe_once()  # 2 failures in a row, 1.2 s of silence (2 deadlines) since then
        assert reports == ["m0"]
        for _ in range(4):
            together.probe_once()
        assert reports == ["m0"]  # both silent at once: neither is declared
    finally:
        for admin in admins:
            admin.resumed.set()
        alone.close()
        together.close()
        for server, _address in served:
            server.stop(0)
