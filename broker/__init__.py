"""Silbo: an elastic content-based publish/subscribe broker for NGSI v2 context data."""

from __future__ import annotations

__version__ = "0.1.0"

__all__ = ["__version__"]
