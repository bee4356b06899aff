"""Names, tenants, service paths and scopes."""

from __future__ import annotations

import pytest

from broker.errors import InvalidIdentifier
from broker.model.identifiers import (
    check_identifier,
    check_scope,
    check_service_path,
    check_tenant,
    scope_matches,
    scopes_covering,
)


@pytest.mark.parametrize("name", ["Room1", "urn:ngsi-ld:Thing:1", "a" * 256, "x-y_z.w"])
def test_valid_identifiers(name: str) -> None:
    assert check_identifier(name, "entity id") == name


@pytest.mark.parametrize(
    ("name", "message"),
    [
        ("", "must not be empty"),
        ("a" * 257, "at most 256"),
        ("a b", "whitespace"),
        ("tab\there", "whitespace"),
        ("caf\u00e9", "non-printable"),
        ("a/b", "forbidden characters: /"),
        ("a#b", "forbidden"),
        ("a?b&c", "forbidden characters: & ?"),
        ("x<y", "forbidden"),
        ("q=1", "forbidden"),
        ("f(x)", "forbidden"),
        ("it's", "forbidden"),
    ],
)
def test_invalid_identifiers(name: str, message: str) -> None:
    with pytest.raises(InvalidIdentifier, match="entity id") as caught:
        check_identifier(name, "entity id")
    assert message in str(caught.value)


def test_identifier_must_be_text() -> None:
    with pytest.raises(InvalidIdentifier, match="must be a string"):
        check_identifier(42, "attribute name")


@pytest.mark.parametrize("tenant", ["", "madrid", "x_1", "a" * 50])
def test_valid_tenants(tenant: str) -> None:
    assert check_tenant(tenant) == tenant


@pytest.mark.parametrize("tenant", ["Madrid", "a-b", "a" * 51, "a b", "é"])
def test_invalid_tenants(tenant: str) -> None:
    with pytest.raises(InvalidIdentifier, match="tenant"):
        check_tenant(tenant)


@pytest.mark.parametrize("path", ["/", "/a", "/a/b_2", "/" + "/".join(["l"] * 10)])
def test_valid_service_paths(path: str) -> None:
    assert check_service_path(path) == path


@pytest.mark.parametrize(
    ("path", "message"),
    [
        ("a", "absolute"),
        ("", "absolute"),
        ("/a/", "level ''"),
        ("/a b", "level"),
        ("/a/#", "level '#'"),
        ("/" + "/".join(["l"] * 11), "11 levels"),
        ("/" + "x" * 51, "1-50"),
    ],
)
def test_invalid_service_paths(path: str, message: str) -> None:
    with pytest.raises(InvalidIdentifier) as caught:
        check_service_path(path)
    assert message in str(caught.value)


@pytest.mark.parametrize("scope", ["/#", "/", "/a", "/a/#", "/a/b/#"])
def test_valid_scopes(scope: str) -> None:
    assert check_scope(scope) == scope


@pytest.mark.parametrize("scope", ["/a#", "/#/a", "#", "/a/#/#", "a/#"])
def test_invalid_scopes(scope: str) -> None:
    with pytest.raises(InvalidIdentifier):
        check_scope(scope)


@pytest.mark.parametrize(
    ("scope", "path", "expected"),
    [
        ("/#", "/", True),
        ("/#", "/a/b", True),
        ("/a/#", "/a", True),
        ("/a/#", "/a/b/c", True),
        ("/a/#", "/a2", False),
        ("/a/#", "/", False),
        ("/a", "/a", True),
        ("/a", "/a/b", False),
        ("/", "/", True),
        ("/", "/a", False),
    ],
)
def test_scope_matches(scope: str, path: str, expected: bool) -> None:
    assert scope_matches(scope, path) is expected


@pytest.mark.parametrize("path", ["/", "/a", "/a/b", "/a2/b/c"])
def test_scopes_covering_lists_exactly_the_matching_scopes(path: str) -> None:
    candidates = ["/", "/#", "/a", "/a/#", "/a/b", "/a/b/#", "/a2", "/a2/#", "/a2/b/#", "/a2/b/c"]
    expected = {s for s in candidates if scope_matches(s, path)}
    assert expected <= set(scopes_covering(path))
    assert all(scope_matches(s, path) for s in scopes_covering(path))
