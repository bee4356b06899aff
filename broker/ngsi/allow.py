"""The notification allow-list: which hosts a subscription may send notifications to.

A notification URL names the host the front will POST to; without a limit, anyone who can
create a subscription can make the broker send requests anywhere its network reaches. So a
URL is accepted only when its host is in the list: an IP address inside one of its networks
(``10.0.0.0/8``, ``192.0.2.7``), or a host name written in it (``receiver.example.com``, or
``*.example.com`` for every name under it; names are compared as written, never resolved).
Loopback (``127.0.0.0/8``, ``::1``, ``localhost``) is always allowed; ``*`` allows every host.
"""

from __future__ import annotations

import ipaddress
from collections.abc import Iterable
from dataclasses import dataclass, field
from urllib.parse import urlsplit

from broker.errors import InvalidInput

__all__ = ["LOOPBACK", "AllowList"]

LOOPBACK = ("127.0.0.0/8", "::1", "localhost")
_Network = ipaddress.IPv4Network | ipaddress.IPv6Network


@dataclass(frozen=True, slots=True)
class AllowList:
    """Hosts notifications may go to (see the module doc)."""

    networks: tuple[_Network, ...] = ()
    names: frozenset[str] = frozenset()
    suffixes: tuple[str, ...] = ()
    everything: bool = False
    entries: tuple[str, ...] = field(default=(), compare=False)

    @classmethod
    def parse(cls, entries: Iterable[str] = ()) -> AllowList:
        """The list of loopback plus ``entries`` (CIDR, address, host, *.domain or *)."""
        given = tuple(entries)
        networks: list[_Network] = []
        names: set[str] = set()
        suffixes: list[str] = []
        everything = False
        problems = []
        for entry in (*LOOPBACK, *given):
            text = entry.strip().lower()
            if text == "*":
                everything = True
                continue
            try:
                networks.append(ipaddress.ip_network(text, strict=False))
                continue
            except ValueError:
                pass
            host = text[2:] if text.startswith("*.") else text
            if not host or any(c in host for c in "/:@ ") or host.startswith("."):
                problems.append(f"--notify-allow {entry!r} is not a CIDR, address or host name")
            elif text.startswith("*."):
                suffixes.append("." + host)
            else:
                names.add(host)
        if problems:
            raise InvalidInput("; ".join(problems))
        return cls(tuple(networks), frozenset(names), tuple(suffixes), everything, given)

    def allows(self, host: str) -> bool:
        """Tell whether notifications may go to ``host`` (a name or an address)."""
        if self.everything:
            return True
        host = host.strip("[]").lower()
        try:
            address = ipaddress.ip_address(host)
        except ValueError:
            return host in self.names or any(host.endswith(s) for s in self.suffixes)
        return any(address in network for network in self.networks)

    def check_url(self, url: str, what: str) -> None:
        """Raise InvalidInput unless ``url`` is an absolute http(s) URL to an allowed host."""
        scheme, host = "", None
        try:
            parts = urlsplit(url)
            scheme, host = parts.scheme, parts.hostname
            _port = parts.port  # ValueError for a port that is no number
        except ValueError:
            host = None
        if scheme not in ("http", "https") or not host:
            raise InvalidInput(f"Invalid URL parsing {what}: {url!r} is not an http(s) URL")
        if not self.allows(host):
            raise InvalidInput(
                f"{what} host {host!r} is not in the notification allow-list "
                "(loopback unless the connection point is started with --notify-allow)"
            )
