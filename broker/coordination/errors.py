"""The errors of the coordination layer, and the one place kazoo's exceptions are translated.

The tree (under :class:`broker.errors.SilboError`)::

    SilboError
    ├── InvalidInput
    │   └── InvalidConfiguration     a proposed cluster configuration is inconsistent
    └── CoordinationError            ZooKeeper or the embedded server failed us
        ├── ZooKeeperUnavailable     ZooKeeper cannot be reached, or the connection or session
        │                            was lost during an operation (its outcome may be unknown)
        ├── ConfigurationConflict    a compare-and-set on the configuration lost to another writer
        ├── CorruptCoordinationData  a znode holds data this build cannot read
        └── EmbeddedServerError      the embedded ZooKeeper server cannot be started
            ├── JavaNotFound         no ``java`` executable
            ├── ZooKeeperJarsNotFound  no ZooKeeper server classes
            └── ServerStartTimeout   it exited or did not answer in time (has the log tail)

Kazoo's exceptions enter only through :func:`translated`, which maps them here
(``raise Mapped(...) from exc``); the rest of the broker never sees a kazoo exception.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from kazoo.exceptions import (
    ConnectionClosedError,
    ConnectionLoss,
    KazooException,
    OperationTimeoutError,
    SessionExpiredError,
)
from kazoo.handlers.threading import KazooTimeoutError

from broker.errors import ErrorMapping, InvalidInput, SilboError, register_mapping

__all__ = [
    "ConfigurationConflict",
    "CoordinationError",
    "CorruptCoordinationData",
    "EmbeddedServerError",
    "InvalidConfiguration",
    "JavaNotFound",
    "ServerStartTimeout",
    "ZooKeeperJarsNotFound",
    "ZooKeeperUnavailable",
    "translated",
]


class CoordinationError(SilboError):
    """ZooKeeper, or the embedded ZooKeeper server, did not do what we needed."""


class ZooKeeperUnavailable(CoordinationError):
    """ZooKeeper cannot be reached, or the connection or session was lost mid-operation.

    When raised by a write, the write may or may not have been applied: read again.
    """


class ConfigurationConflict(CoordinationError):
    """A compare-and-set update lost: someone else changed the znode since it was read."""


class CorruptCoordinationData(CoordinationError):
    """A znode holds data that this build cannot decode."""


class InvalidConfiguration(InvalidInput):
    """A proposed cluster configuration is inconsistent (epoch, matchers, selector)."""


class EmbeddedServerError(CoordinationError):
    """The embedded ZooKeeper server cannot be started."""


class JavaNotFound(EmbeddedServerError):
    """No ``java`` executable was found (explicit path, ``JAVA_HOME`` or ``PATH``)."""


class ZooKeeperJarsNotFound(EmbeddedServerError):
    """No directory holding the ZooKeeper server classes was found."""


class ServerStartTimeout(EmbeddedServerError):
    """The server exited, or did not answer within its deadline; ``log_tail`` says why."""

    def __init__(self, message: str, *, log_tail: str) -> None:
        super().__init__(f"{message}\n--- last lines of the ZooKeeper log ---\n{log_tail}")
        self.reason = message
        self.log_tail = log_tail


@contextmanager
def translated(action: str) -> Iterator[None]:
    """Run a block of kazoo calls, re-raising kazoo's exceptions as coordination errors.

    ``action`` completes the sentence "could not ..." in the message. Exceptions the caller
    expects (NoNodeError, BadVersionError, ...) must be caught inside the block.
    """
    try:
        yield
    except (
        ConnectionLoss,
        ConnectionClosedError,
        SessionExpiredError,
        OperationTimeoutError,
        KazooTimeoutError,
    ) as exc:
        raise ZooKeeperUnavailable(
            f"could not {action}: ZooKeeper connection lost ({type(exc).__name__})"
        ) from exc
    except KazooException as exc:
        raise CoordinationError(f"could not {action}: {type(exc).__name__} {exc}") from exc


register_mapping(ZooKeeperUnavailable, ErrorMapping("UNAVAILABLE", 503, "InternalServerError"))
register_mapping(ConfigurationConflict, ErrorMapping("ABORTED", 409, "Conflict"))
register_mapping(CorruptCoordinationData, ErrorMapping("DATA_LOSS", 500, "InternalServerError"))
