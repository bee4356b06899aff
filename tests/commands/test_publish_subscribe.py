"""``silbo publish`` and ``silbo subscribe`` against real clusters, as a user runs them.

The subscriber runs as a subprocess (``python -c ... subscribe.main()``), so its stdout is a
real pipe: JSON lines, flushed one by one, and a reader that may go away early. Publishing
runs in-process through ``publish.main``. Bad input is checked in-process (exit status and
the one-line message) and once in a subprocess (no traceback).
"""

from __future__ import annotations

import contextlib
import json
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from conftest import StartCluster

from broker.commands import publish, subscribe
from broker.errors import InvalidInput

_ROOT = Path(__file__).resolve().parents[2]
_SUBSCRIBE = "import sys; from broker.commands.subscribe import main; sys.exit(main())"
_PUBLISH = "import sys; from broker.commands.publish import main; sys.exit(main())"
_WAIT = 20.0


class _Subscriber:
    """A ``silbo subscribe`` subprocess; stderr is collected on a thread as it comes.

    It runs with faulthandler on, so that a subscriber that hangs can say where.
    """

    def __init__(self, *arguments: str) -> None:
        self.process = subprocess.Popen(
            [sys.executable, "-X", "faulthandler", "-c", _SUBSCRIBE, *arguments],
            cwd=_ROOT,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        self._errors: list[str] = []
        self._subscribed = threading.Event()
        self._reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._reader.start()

    def _read_stderr(self) -> None:
        assert self.process.stderr is not None
        for line in self.process.stderr:
            self._errors.append(line)
            if line.startswith("subscribed "):
                self._subscribed.set()
        self._subscribed.set()  # it ended: whoever waits looks at why

    @property
    def stderr(self) -> str:
        return "".join(self._errors)

    def wait_subscribed(self) -> str:
        """The subscription id, once the subscriber said it holds one."""
        assert self._subscribed.wait(_WAIT), "no 'subscribed' line in time"
        assert self.process.poll() is None, self.stderr
        return self._errors[0].split()[1]

    @contextlib.contextmanager
    def _deadline(self) -> Iterator[None]:
        """Abort the subscriber if the block takes too long (faulthandler then prints where
        each of its threads was, into the stderr that the failing assertion shows)."""
        abort = threading.Timer(_WAIT, self.process.send_signal, (signal.SIGABRT,))
        kill = threading.Timer(_WAIT + 5, self.process.kill)
        abort.start()
        kill.start()
        try:
            yield
        finally:
            abort.cancel()
            kill.cancel()

    def read_line(self) -> str:
        """The next line of stdout (the subscriber is aborted if none comes in time)."""
        assert self.process.stdout is not None
        with self._deadline():
            return self.process.stdout.readline()

    def finish(self) -> tuple[int, str]:
        """``(exit status, stdout)`` once it exits (aborted if it does not in time)."""
        assert self.process.stdout is not None
        with self._deadline():
            out = "" if self.process.stdout.closed else self.process.stdout.read()
            status = self.process.wait()
        self._reader.join(_WAIT)
        return status, out

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
        self.process.wait()


@pytest.fixture
def subscriber() -> Iterator[type[_Subscriber]]:
    """Start subscribers with ``subscriber(*arguments)``; any still running are killed after."""
    started: list[_Subscriber] = []

    class Tracked(_Subscriber):
        def __init__(self, *arguments: str) -> None:
            super().__init__(*arguments)
            started.append(self)

    yield Tracked
    for each in started:
        each.kill()


def _publish(capsys: pytest.CaptureFixture[str], *arguments: str) -> str:
    status = publish.main(list(arguments))
    captured = capsys.readouterr()
    assert status == 0, captured.err
    assert captured.err == ""
    return captured.out


def _lines(out: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in out.splitlines()]


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port: int = probe.getsockname()[1]
        return port


# -- through a real cluster -----------------------------------------------------------------


def test_published_updates_reach_a_subscriber_in_order(
    start_cluster: StartCluster,
    subscriber: type[_Subscriber],
    capsys: pytest.CaptureFixture[str],
) -> None:
    cluster = start_cluster(matchers=2)
    where = ["--state-dir", str(cluster.state_dir)]
    rooms = subscriber(*where, "--type", "Room", "--count", "2")
    subscription_id = rooms.wait_subscribed()
    assert rooms.process.stdout is not None

    first = _publish(
        capsys, *where, "--entity", "Room1", "--type", "Room", "--publisher", "cli-test",
        "temperature=30", "humidity=41.5", "on=true", "info={\"floor\": 2, \"tags\": [\"a\"]}",
        "name=kitchen", "zip=08001", "quoted=\"30\"", "nothing=null", "odd=NaN",
        "dateObserved:DateTime=2024-01-01T00:00:00Z", "code:Text=42",
        "location:geo:json={\"type\": \"Point\", \"coordinates\": [2.1, 41.4]}",
    )  # fmt: skip
    assert first == "published Room1 (12 attributes) as cli-test #1\n"
    _publish(capsys, *where, "--entity", "Lamp1", "--type", "Lamp", "on=true")  # not a Room
    second = _publish(
        capsys, *where, "--entity", "Room2", "--type", "Room", "--publisher", "cli-test",
        "--sequence", "2", "temperature=-4",
    )  # fmt: skip
    assert second == "published Room2 (1 attribute) as cli-test #2\n"

    status, out = rooms.finish()
    assert status == 0, rooms.stderr + out
    assert "Traceback" not in rooms.stderr
    got = _lines(out)
    assert [(n["data"]["id"], n["sequence"]) for n in got] == [("Room1", 1), ("Room2", 2)]
    assert {n["subscriptionId"] for n in got} == {subscription_id}
    assert {n["publisher"] for n in got} == {"cli-test"}
    room1 = got[0]["data"]
    assert room1.pop("id") == "Room1"
    assert room1.pop("type") == "Room"
    assert {name: (a["type"], a["value"]) for name, a in room1.items()} == {
        "temperature": ("Number", 30),
        "humidity": ("Number", 41.5),
        "on": ("Boolean", True),
        "info": ("StructuredValue", {"floor": 2, "tags": ["a"]}),
        "name": ("Text", "kitchen"),
        "zip": ("Text", "08001"),
        "quoted": ("Text", "30"),
        "nothing": ("None", None),
        "odd": ("Text", "NaN"),
        "dateObserved": ("DateTime", "2024-01-01T00:00:00Z"),
        "code": ("Text", "42"),
        "location": ("geo:json", {"type": "Point", "coordinates": [2.1, 41.4]}),
    }
    assert all(a["metadata"] == {} for a in room1.values())
    assert got[1]["data"] == {
        "id": "Room2",
        "type": "Room",
        "temperature": {"type": "Number", "value": -4, "metadata": {}},
    }


def test_attrs_q_and_condition_attrs_shape_what_is_printed(
    start_cluster: StartCluster,
    subscriber: type[_Subscriber],
    capsys: pytest.CaptureFixture[str],
) -> None:
    cluster = start_cluster(matchers=1)
    where = ["--connect", ",".join(cluster.endpoints)]
    hot = subscriber(
        *where, "--id-pattern", "Room.*", "--q", "temperature>25", "--attrs", "temperature,co2",
        "--condition-attrs", "temperature", "--count", "1",
    )  # fmt: skip
    hot.wait_subscribed()
    _publish(capsys, *where, "--entity", "Room1", "temperature=20", "humidity=40")  # q fails
    _publish(capsys, *where, "--entity", "Hall", "temperature=30")  # id fails
    _publish(capsys, *where, "--entity", "Room2", "temperature=31", "humidity=50", "co2=400")
    status, out = hot.finish()
    assert status == 0, hot.stderr + out
    (only,) = _lines(out)
    assert only["data"] == {
        "id": "Room2",
        "type": "Thing",
        "temperature": {"type": "Number", "value": 31, "metadata": {}},
        "co2": {"type": "Number", "value": 400, "metadata": {}},
    }


def test_an_early_reader_exit_and_ctrl_c_end_the_subscriber_quietly(
    start_cluster: StartCluster,
    subscriber: type[_Subscriber],
    capsys: pytest.CaptureFixture[str],
) -> None:
    cluster = start_cluster(matchers=1)
    where = ["--state-dir", str(cluster.state_dir)]
    head = subscriber(*where, "--count", "5")  # as in: silbo subscribe --count 5 | head -1
    quiet = subscriber(*where, "--id", "Nobody")  # never notified; then Ctrl-C
    head.wait_subscribed()
    quiet.wait_subscribed()

    _publish(capsys, *where, "--entity", "Room1", "temperature=1")
    assert json.loads(head.read_line())["data"]["id"] == "Room1"
    assert head.process.stdout is not None
    head.process.stdout.close()  # the reader goes away; the next write finds no one
    _publish(capsys, *where, "--entity", "Room2", "temperature=2")
    status, _out = head.finish()
    assert status == 0, head.stderr
    assert "Traceback" not in head.stderr
    assert "BrokenPipe" not in head.stderr

    quiet.process.send_signal(signal.SIGINT)
    status, out = quiet.finish()
    assert status == 0, quiet.stderr + out
    assert out == ""  # nothing but notifications on stdout
    assert quiet.stderr.startswith("subscribed ")
    assert quiet.stderr.count("\n") == 1, quiet.stderr  # and nothing after it on stderr


# -- input errors: one line, exit status 2 ----------------------------------------------------


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--entity", "Room 1", "t=1"], "entity id 'Room 1' has whitespace"),
        (["--entity", "Room#1", "t=1"], "forbidden characters: #"),
        (["--entity", "Room1", "temperature"], "'temperature' is not NAME=VALUE"),
        (["--entity", "Room1", "=30"], "names no attribute"),
        (["--entity", "Room1", "t:=30"], "names no type"),
        (["--entity", "Room1", "t=1", "t=2"], "attribute 't' is given twice"),
        (["--entity", "Room1", "id=1"], "attribute name 'id' is reserved"),
        (["--entity", "Room1", "when:DateTime=soon"], "attribute 'when' is typed DateTime"),
        (["--entity", "Room1", "--tenant", "Acme", "t=1"], "tenant 'Acme'"),
        (["--entity", "Room1", "--service-path", "rel", "t=1"], "must be absolute"),
    ],
)
def test_bad_publish_input_is_one_line_and_status_2(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status = publish.main([*arguments, "--state-dir", str(tmp_path)])
    captured = capsys.readouterr()
    assert status == 2
    assert captured.out == ""
    assert captured.err.startswith("silbo publish: error: ")
    assert message in captured.err
    assert captured.err.count("\n") == 1


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--q", "temperature>>3"], "in q, unknown operator '>>'"),
        (["--mq", "temperature.accuracy<"], "mq"),
        (["--id-pattern", "Room("], "does not compile"),
        (["--type", "Room Type"], "has whitespace"),
        (["--attrs", "a;b"], "forbidden characters"),
        (["--tenant", "Acme"], "tenant 'Acme'"),
        (["--service-path", "/a/#/b"], "'#' may only end the path"),
    ],
)
def test_bad_subscribe_input_is_one_line_and_status_2(
    arguments: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    status = subscribe.main([*arguments, "--state-dir", str(tmp_path)])
    captured = capsys.readouterr()
    assert status == 2
    assert captured.out == ""
    assert captured.err.startswith("silbo subscribe: error: ")
    assert message in captured.err
    assert captured.err.count("\n") == 1


@pytest.mark.parametrize("command", [publish, subscribe])
def test_no_cluster_in_the_state_dir_is_status_2(
    command: Any,
    capsys: pytest.CaptureFixture[str],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.chdir(tmp_path)  # the default state directory is .silbo, here
    status = command.main(["--entity", "Room1", "t=1"] if command is publish else [])
    captured = capsys.readouterr()
    assert (status, captured.out) == (2, "")
    assert "no cluster described in .silbo/cluster.json" in captured.err
    status = command.main(
        ["--state-dir", str(tmp_path), *(["--entity", "R", "t=1"] if command is publish else [])]
    )
    assert status == 2
    assert f"no cluster described in {tmp_path / 'cluster.json'}" in capsys.readouterr().err


@pytest.mark.parametrize("command", [publish, subscribe])
def test_an_unreachable_endpoint_fails_within_the_timeout(
    command: Any, capsys: pytest.CaptureFixture[str]
) -> None:
    address = f"127.0.0.1:{_free_port()}"
    arguments = ["--connect", address, "--timeout", "1"]
    if command is publish:
        arguments += ["--entity", "Room1", "t=1"]
    started = time.monotonic()
    status = command.main(arguments)
    elapsed = time.monotonic() - started
    captured = capsys.readouterr()
    assert (status, captured.out) == (2, "")
    assert captured.err.startswith(f"silbo {command.__name__.rsplit('.', 1)[-1]}: error: ")
    assert f"from {address} within 1 s" in captured.err
    assert elapsed < 5


def test_a_bad_argument_in_a_real_process_has_no_traceback(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-c", _PUBLISH, "--state-dir", str(tmp_path), "--entity", "R1", "t"],
        cwd=_ROOT,
        capture_output=True,
        text=True,
        timeout=_WAIT,
        check=False,
    )
    assert done.returncode == 2
    assert done.stdout == ""
    assert done.stderr == (
        "silbo publish: error: 't' is not NAME=VALUE (or NAME:TYPE=VALUE): it has no '='\n"
    )


@pytest.mark.parametrize(
    "arguments", [["--count", "0"], ["--timeout", "-1"], ["--id", "a", "--id-pattern", "b"]]
)
def test_argument_errors_exit_2(arguments: list[str], capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stopped:
        subscribe.main(arguments)
    assert stopped.value.code == 2
    assert "silbo subscribe: error: argument" in capsys.readouterr().err


# -- value typing -----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("text", "name", "type_", "value"),
    [
        ("t=30", "t", "Number", 30),
        ("t=-2.5e1", "t", "Number", -25.0),
        ("on=false", "on", "Boolean", False),
        ("x=null", "x", "None", None),
        ('o={"a": [1, {"b": null}]}', "o", "StructuredValue", {"a": [1, {"b": None}]}),
        ("l=[1,2]", "l", "StructuredValue", [1, 2]),
        ("s=hello world", "s", "Text", "hello world"),
        ('s="42"', "s", "Text", "42"),
        ("s=", "s", "Text", ""),
        ("s=Infinity", "s", "Text", "Infinity"),
        ("s={not json", "s", "Text", "{not json"),
        ("eq=a=b", "eq", "Text", "a=b"),
        ("n:Integer=5", "n", "Integer", 5),
        ("n:Text=5", "n", "Text", "5"),
        ("d:ISO8601=2024-02-29", "d", "ISO8601", "2024-02-29"),
        ("p:geo:point=41.4, 2.1", "p", "geo:point", "41.4, 2.1"),
    ],
)
def test_values_are_json_or_text_and_may_be_typed(
    text: str, name: str, type_: str, value: Any
) -> None:
    got_name, attribute = publish.parse_assignment(text)
    assert (got_name, attribute.type, attribute.value) == (name, type_, value)
    assert type(attribute.value) is type(value)


def test_a_bad_value_names_its_attribute() -> None:
    with pytest.raises(InvalidInput, match="attribute 'when' is typed DateTime but"):
        publish.parse_assignment("when:DateTime=tomorrow")
