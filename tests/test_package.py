"""The package as users see it: the public API of ``broker``, its version, the extras."""

from __future__ import annotations

import importlib
import importlib.util
import tomllib
from pathlib import Path
from typing import Any

import pytest

import broker
import broker.extras
from broker import cli
from broker.errors import MissingExtra, SilboError

_ROOT = Path(__file__).resolve().parent.parent


def test_public_names_are_pinned() -> None:
    assert broker.__all__ == [
        "AddressInUse",
        "AlreadyExists",
        "Attribute",
        "AttrsFormat",
        "Client",
        "ContextUpdate",
        "Engine",
        "EntitySelector",
        "InvalidIdentifier",
        "InvalidInput",
        "InvalidRegex",
        "InvalidSubscription",
        "InvalidUpdate",
        "InvalidValue",
        "Metadata",
        "MissingExtra",
        "NotFound",
        "Notification",
        "NotificationOptions",
        "QuerySyntaxError",
        "SerializationError",
        "SilboError",
        "Status",
        "Subscription",
        "SubscriptionHandle",
        "Unavailable",
        "__version__",
    ]


@pytest.mark.parametrize("name", [n for n in broker.__all__ if n != "__version__"])
def test_each_public_name_is_the_defining_modules_object(name: str) -> None:
    value = getattr(broker, name)
    module = importlib.import_module(value.__module__)
    assert getattr(module, name) is value
    assert name in dir(broker)


def test_errors_are_all_exported() -> None:
    errors = importlib.import_module("broker.errors")
    classes = {n for n in errors.__all__ if isinstance(getattr(errors, n), type)}
    exported = {n for n in classes if issubclass(getattr(errors, n), SilboError)}
    assert exported <= set(broker.__all__)


def test_unknown_name_is_an_attribute_error() -> None:
    with pytest.raises(AttributeError, match="no attribute 'Nothing'"):
        _ = broker.Nothing


def test_the_version_is_written_once() -> None:
    project = tomllib.loads((_ROOT / "pyproject.toml").read_text())["project"]
    assert "version" not in project
    assert project["dynamic"] == ["version"]
    assert broker.__version__.count(".") == 2


def test_the_package_is_typed() -> None:
    assert (Path(broker.__file__).parent / "py.typed").is_file()


def _without(modules: set[str], monkeypatch: pytest.MonkeyPatch) -> None:
    real = importlib.util.find_spec

    def find_spec(name: str, package: str | None = None) -> Any:
        return None if name in modules else real(name, package)

    monkeypatch.setattr(broker.extras, "find_spec", find_spec)


def test_require_names_the_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    _without({"pyarrow"}, monkeypatch)
    with pytest.raises(MissingExtra, match=r"^silbo replay needs pyarrow: install silbo\[spark\]"):
        broker.extras.require("spark", "silbo replay")
    broker.extras.require("bench", "a plot")  # matplotlib is there: no error


def test_replay_without_spark_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    _without({"pyspark"}, monkeypatch)
    updates = tmp_path / "updates.jsonl"
    updates.write_text("")
    subscriptions = tmp_path / "subscriptions.json"
    subscriptions.write_text("[]")
    status = cli.main(
        [
            "replay",
            "--updates", str(updates),
            "--subscriptions", str(subscriptions),
            "--out", str(tmp_path / "out.jsonl"),
        ]
    )  # fmt: skip
    assert status == 2
    error = capsys.readouterr().err
    assert "silbo replay needs pyspark: install silbo[spark]" in error


def test_plot_without_bench_says_what_to_install(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    from broker.bench.timeline import plot

    _without({"matplotlib"}, monkeypatch)
    with pytest.raises(MissingExtra, match=r"install silbo\[bench\]"):
        plot({"series": {}}, tmp_path / "x.png")


def test_extras_match_pyproject() -> None:
    extras = tomllib.loads((_ROOT / "pyproject.toml").read_text())["project"][
        "optional-dependencies"
    ]
    for extra, modules in broker.extras.EXTRAS.items():
        names = " ".join(extras[extra]).replace("-", "_")
        for module in modules:
            assert module in names, (extra, module)
