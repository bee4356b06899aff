"""Network addresses as the command line and the configuration give them."""

from __future__ import annotations

from broker.errors import InvalidInput

__all__ = ["parse_address"]


def parse_address(text: str, what: str = "address") -> tuple[str, int]:
    """``(host, port)`` of ``HOST:PORT`` (port 0: any free one); InvalidInput otherwise."""
    host, sep, port_text = text.rpartition(":")
    if not sep or not host or not port_text.isdigit() or int(port_text) > 65535:
        raise InvalidInput(f"{what} {text!r} must be HOST:PORT with a port from 0 to 65535")
    return host.strip("[]"), int(port_text)
