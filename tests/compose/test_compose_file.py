"""compose/docker-compose.yml without a Docker engine: valid Compose, and wired as Silbo needs.

There is no Docker engine on the development machine, so this module checks what can be
checked statically:

- the file validates against the Compose specification's JSON schema (vendored in
  ``compose-spec.json`` next to this module, with the validator of the draft it declares), and
  mutated copies with a typo'd key or a wrongly typed value do not;
- three ZooKeeper nodes with distinct ``ZOO_MY_ID`` and one ``ZOO_SERVERS`` naming all three;
- every broker role runs as ``silbo run <role>`` (the image's entrypoint plus the service's
  command) against the whole ensemble, each process advertising its own service name;
- the one-shot ``init`` runs ``silbo admin init`` for as many matchers as there are;
- the broker image is built from the repository root with ``compose/Dockerfile``;
- the Spark worker joins the master's URL; every ``service_healthy`` dependency has a
  healthcheck.
"""

from __future__ import annotations

import copy
import json
import shlex
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from jsonschema.validators import validator_for

ROOT = Path(__file__).resolve().parents[2]
COMPOSE_DIR = ROOT / "compose"
COMPOSE_FILE = COMPOSE_DIR / "docker-compose.yml"
DOCKERFILE = COMPOSE_DIR / "Dockerfile"
SCHEMA_FILE = Path(__file__).resolve().parent / "compose-spec.json"

ZK_NODES = ("zk1", "zk2", "zk3")
ZK_CONNECT = {f"{node}:2181" for node in ZK_NODES}
ROLES = ("connection-point", "access-point", "matcher", "exit-point", "context-store")
CLUSTER = "silbo"

Document = dict[str, Any]


# --- loading ---------------------------------------------------------------------------------


def load_compose() -> Document:
    """The compose file as YAML data (anchors and ``<<`` merges resolved)."""
    document = yaml.safe_load(COMPOSE_FILE.read_text(encoding="utf-8"))
    assert isinstance(document, dict), "the compose file must be a mapping"
    return document


def load_schema() -> Document:
    schema = json.loads(SCHEMA_FILE.read_text(encoding="utf-8"))
    assert isinstance(schema, dict)
    return schema


def schema_errors(document: Document) -> list[str]:
    """Every violation of the Compose schema in ``document``, as ``path: message`` lines."""
    schema = load_schema()
    validator = validator_for(schema)(schema)
    return [
        f"{'/'.join(str(part) for part in error.absolute_path) or '<root>'}: {error.message}"
        for error in validator.iter_errors(document)
    ]


@pytest.fixture(scope="module")
def compose() -> Document:
    return load_compose()


@pytest.fixture(scope="module")
def services(compose: Document) -> dict[str, Document]:
    found = compose["services"]
    assert isinstance(found, dict)
    return found


# --- reading services ------------------------------------------------------------------------


def dockerfile_entrypoint() -> list[str]:
    """The exec-form ``ENTRYPOINT`` of compose/Dockerfile."""
    lines = [line.strip() for line in DOCKERFILE.read_text(encoding="utf-8").splitlines()]
    found = [
        line.removeprefix("ENTRYPOINT").strip() for line in lines if line.startswith("ENTRYPOINT")
    ]
    assert len(found) == 1, f"compose/Dockerfile must have one ENTRYPOINT, found {found}"
    entrypoint = json.loads(found[0])
    assert isinstance(entrypoint, list), "ENTRYPOINT must be in exec (JSON array) form"
    return [str(part) for part in entrypoint]


def as_argv(value: object) -> list[str]:
    """A Compose ``command``/``entrypoint`` (string or list) as an argument vector."""
    if value is None:
        return []
    if isinstance(value, str):
        return shlex.split(value)
    assert isinstance(value, list)
    return [str(part) for part in value]


def service_argv(service: Document) -> list[str]:
    """What the service's container runs: its entrypoint (or the image's) and command."""
    if "entrypoint" in service:
        entrypoint = as_argv(service["entrypoint"])
    elif "build" in service:
        entrypoint = dockerfile_entrypoint()
    else:
        entrypoint = []
    return entrypoint + as_argv(service.get("command"))


def options(argv: list[str]) -> dict[str, str]:
    """``--name value`` pairs of an argument vector (each option given once)."""
    found: dict[str, str] = {}
    for index, arg in enumerate(argv):
        if arg.startswith("--"):
            name, sep, inline = arg.partition("=")
            assert name not in found, f"{name} given twice in {argv}"
            if sep:
                found[name] = inline
            else:
                assert index + 1 < len(argv), f"{name} has no value in {argv}"
                found[name] = argv[index + 1]
    return found


def broker_services(services: dict[str, Document]) -> Iterator[tuple[str, str, list[str]]]:
    """``(service name, role, argv)`` of every service that runs ``silbo run <role>``."""
    for name, service in services.items():
        argv = service_argv(service)
        if argv[:2] == ["silbo", "run"]:
            assert len(argv) > 2, f"{name}: `silbo run` without a role"
            yield name, argv[2], argv


def environment(service: Document) -> dict[str, str]:
    """A service's environment (list or mapping form) as a mapping."""
    env = service.get("environment", {})
    if isinstance(env, list):
        return dict(str(item).partition("=")[::2] for item in env)
    assert isinstance(env, dict)
    return {str(key): str(value) for key, value in env.items()}


def healthy_dependencies(service: Document) -> list[str]:
    """The services this one waits on with ``condition: service_healthy``."""
    depends = service.get("depends_on", {})
    if isinstance(depends, list):
        return []
    return [dep for dep, spec in depends.items() if spec.get("condition") == "service_healthy"]


# --- the schema ------------------------------------------------------------------------------


def test_vendored_schema_is_the_compose_specification() -> None:
    schema = load_schema()
    assert schema["title"] == "Compose Specification"
    cls = validator_for(schema)
    # The validator is the draft the schema declares, not a fallback for an unknown $schema.
    assert str(cls.META_SCHEMA["$id"]).rstrip("#") == str(schema["$schema"]).rstrip("#")
    cls.check_schema(schema)
    assert "service" in schema["definitions"]


def test_compose_file_is_valid_compose(compose: Document) -> None:
    errors = schema_errors(compose)
    assert not errors, "compose/docker-compose.yml violates the Compose spec:\n" + "\n".join(errors)


def _unknown_service_key(document: Document) -> None:
    document["services"]["connection-point"]["listen_port"] = 7000


def _ports_not_a_list(document: Document) -> None:
    document["services"]["connection-point"]["ports"] = 7


def _unknown_depends_on_condition(document: Document) -> None:
    document["services"]["init"]["depends_on"]["matcher-1"]["condition"] = "service_ready"


def _unknown_top_level_key(document: Document) -> None:
    document["service"] = document["services"]


def _healthcheck_interval_as_number(document: Document) -> None:
    document["services"]["zk1"]["healthcheck"]["interval"] = 5


@pytest.mark.parametrize(
    "mutate",
    [
        _unknown_service_key,
        _ports_not_a_list,
        _unknown_depends_on_condition,
        _unknown_top_level_key,
        _healthcheck_interval_as_number,
    ],
)
def test_schema_rejects_a_broken_copy(
    compose: Document, mutate: Callable[[Document], None]
) -> None:
    broken = copy.deepcopy(compose)
    mutate(broken)
    assert schema_errors(broken), f"{mutate.__name__}: the mutated file still validates"


# --- ZooKeeper -------------------------------------------------------------------------------


def test_three_zookeeper_nodes_form_one_ensemble(services: dict[str, Document]) -> None:
    zookeepers = {
        name: service
        for name, service in services.items()
        if str(service.get("image", "")).startswith("zookeeper:")
    }
    assert sorted(zookeepers) == list(ZK_NODES)
    ids = {name: environment(service).get("ZOO_MY_ID") for name, service in zookeepers.items()}
    assert sorted(ids.values(), key=str) == ["1", "2", "3"], ids
    expected = {f"server.{ids[node]}={node}:2888:3888;2181" for node in ZK_NODES}
    for name, service in zookeepers.items():
        assert service["image"] == "zookeeper:3.9"
        servers = environment(service).get("ZOO_SERVERS", "").split()
        assert len(servers) == len(set(servers))
        assert set(servers) == expected, f"{name}: ZOO_SERVERS {servers}"
        assert "healthcheck" in service, f"{name} has no healthcheck"


# --- broker processes ------------------------------------------------------------------------


def test_every_role_runs_against_the_whole_ensemble(services: dict[str, Document]) -> None:
    brokers = list(broker_services(services))
    assert sorted({role for _, role, _ in brokers}) == sorted(ROLES)
    assert sum(role == "matcher" for _, role, _ in brokers) >= 2, "at least two matchers"
    for name, role, argv in brokers:
        opts = options(argv)
        assert set(opts["--zk"].split(",")) == ZK_CONNECT, f"{name}: --zk {opts['--zk']}"
        assert opts["--cluster"] == CLUSTER, name
        listen_port = opts["--listen"].rpartition(":")[2]
        assert opts["--listen"] == f"0.0.0.0:{listen_port}", name
        assert opts["--advertise"] == f"{name}:{listen_port}", f"{name} ({role})"
        assert opts["--metrics-listen"].startswith("0.0.0.0:"), name


def test_every_broker_process_advertises_a_distinct_address(
    services: dict[str, Document],
) -> None:
    advertised = [options(argv)["--advertise"] for _, _, argv in broker_services(services)]
    assert len(advertised) == len(set(advertised)), advertised


def test_brokers_wait_for_a_healthy_ensemble(services: dict[str, Document]) -> None:
    for name, _, _ in broker_services(services):
        assert set(ZK_NODES) <= set(healthy_dependencies(services[name])), name


def test_connection_point_is_published_on_7777(services: dict[str, Document]) -> None:
    (name,) = [name for name, role, _ in broker_services(services) if role == "connection-point"]
    service = services[name]
    listen_port = options(service_argv(service))["--listen"].rpartition(":")[2]
    assert f"7777:{listen_port}" in [str(port) for port in service.get("ports", [])]


def test_init_configures_the_cluster_once_the_matchers_are_up(
    services: dict[str, Document],
) -> None:
    init = services["init"]
    argv = service_argv(init)
    assert argv[:3] == ["silbo", "admin", "init"], argv
    opts = options(argv)
    assert set(opts["--zk"].split(",")) == ZK_CONNECT
    assert opts["--cluster"] == CLUSTER
    matchers = [name for name, role, _ in broker_services(services) if role == "matcher"]
    assert int(opts["--matchers"]) == len(matchers)
    assert int(opts["--timeout"]) > 0
    assert set(matchers) <= set(healthy_dependencies(init))
    assert init.get("restart") == "no", "a one-shot must not be restarted"


# --- images ----------------------------------------------------------------------------------


def test_dockerfile_installs_the_repository_and_runs_silbo() -> None:
    assert DOCKERFILE.is_file()
    lines = [line.strip() for line in DOCKERFILE.read_text(encoding="utf-8").splitlines()]
    assert [line for line in lines if line.startswith("FROM ")] == ["FROM python:3.11-slim"]
    assert any("pip install ." in line for line in lines if not line.startswith("#"))
    assert dockerfile_entrypoint() == ["silbo"]


def test_silbo_services_are_built_from_the_repository_root(
    services: dict[str, Document],
) -> None:
    built = {name: service["build"] for name, service in services.items() if "build" in service}
    assert {name for name, _, _ in broker_services(services)} | {"init"} <= set(built)
    for name, build in built.items():
        assert isinstance(build, dict), f"{name}: build must name context and dockerfile"
        context = (COMPOSE_DIR / build["context"]).resolve()
        assert context == ROOT, f"{name}: build context {context}"
        assert (context / build["dockerfile"]).resolve() == DOCKERFILE, name


# --- Spark -----------------------------------------------------------------------------------


def test_spark_worker_joins_the_master(services: dict[str, Document]) -> None:
    master, worker = services["spark-master"], services["spark-worker"]
    for service in (master, worker):
        assert str(service["image"]).startswith("apache/spark:")
    master_argv = service_argv(master)
    assert "org.apache.spark.deploy.master.Master" in master_argv
    master_opts = options(master_argv)
    master_url = f"spark://{master_opts['--host']}:{master_opts['--port']}"
    assert master_url == "spark://spark-master:7077"
    worker_argv = service_argv(worker)
    assert "org.apache.spark.deploy.worker.Worker" in worker_argv
    assert worker_argv[-1] == master_url
    assert "spark-master" in healthy_dependencies(worker)
    assert "7077:7077" in [str(port) for port in master.get("ports", [])]


# --- dependencies ----------------------------------------------------------------------------


def test_every_awaited_service_has_a_healthcheck(services: dict[str, Document]) -> None:
    for name, service in services.items():
        for dependency in healthy_dependencies(service):
            assert dependency in services, f"{name} depends on unknown {dependency}"
            assert "healthcheck" in services[dependency], (
                f"{name} waits for {dependency} to be healthy, which has no healthcheck"
            )
