"""An embedded, standalone ZooKeeper server run as a child process (for one-host runs and tests).

Finding the pieces:

- ``java``: the path given, else ``$JAVA_HOME/bin/java``, else ``java`` on ``PATH``
  (:class:`JavaNotFound` otherwise).
- the server classes: the directories given, else pyspark's ``jars/`` (pyspark is a Silbo
  dependency and ships ZooKeeper 3.9), else Debian's ``zookeeper`` package
  (``/usr/share/zookeeper``, with its dependencies in ``/usr/share/java``)
  (:class:`ZooKeeperJarsNotFound` otherwise).

Starting: a ``zoo.cfg`` is written into the data directory (a fresh temporary one unless one
is given) binding ``127.0.0.1:<port>`` (a free port unless one is given; a taken one is
``AddressInUse``), with the admin HTTP server off and the four-letter words allowed.
The JVM is kept small (``-Xmx256m``, serial GC) and all its output goes to
``<data dir>/zookeeper.log``, never to the caller's terminal. :meth:`EmbeddedZooKeeper.start`
returns once the server answers the ``srvr`` four-letter word as serving, or raises
:class:`ServerStartTimeout` with the log's last lines.

Lifecycle and signals: the server runs in its own session (process group), so a Ctrl-C in
the terminal reaches only the parent, which can stop its broker processes first and the
server last, in order. The parent must therefore stop it: use the context manager, or call
:meth:`EmbeddedZooKeeper.stop`; as a last resort an ``atexit`` hook stops any server still
running when the interpreter exits. A parent killed with SIGKILL leaves the server running
(``<data dir>/zookeeper.pid`` names it). ``stop`` sends SIGTERM to the group, SIGKILL after
a grace period, waits for the process, and removes a temporary data directory.

States::

    NEW --start()--> RUNNING --stop()--> STOPPED
    NEW --start() fails--> STOPPED   (the child, if any, is killed; temp dir removed)
"""

from __future__ import annotations

import atexit
import contextlib
import ctypes
import enum
import errno
import importlib.util
import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from types import TracebackType

from broker.coordination.errors import (
    EmbeddedServerError,
    JavaNotFound,
    ServerStartTimeout,
    ZooKeeperJarsNotFound,
)
from broker.errors import AddressInUse
from broker.processes import command_line, running

__all__ = [
    "DEBIAN_JAR_DIRS",
    "EmbeddedZooKeeper",
    "ServerState",
    "default_jar_dirs",
    "die_with_parent",
    "find_classpath",
    "find_java",
    "free_port",
    "stop_detached",
]

MAIN_CLASS = "org.apache.zookeeper.server.ZooKeeperServerMain"
DEBIAN_JAR_DIRS = (Path("/usr/share/zookeeper"), Path("/usr/share/java"))
JVM_OPTIONS = (
    "-Xmx256m",
    "-XX:+UseSerialGC",
    "-XX:TieredStopAtLevel=1",  # C1 only: starts faster; the server is not CPU-bound here
    "-Djava.awt.headless=true",
    "-Dzookeeper.jmx.log4j.disable=true",
)
LOG_NAME = "zookeeper.log"
_PR_SET_PDEATHSIG = 1
_PORT_ATTEMPTS = 3
HOST = "127.0.0.1"

_INSTALL_HINT = (
    "install silbo[spark] (pip install 'silbo[spark]': pyspark ships ZooKeeper's jars) "
    "or Debian's ZooKeeper (apt-get install zookeeper)"
)
_LOG4J2 = """\
status = warn
appender.file.type = File
appender.file.name = file
appender.file.fileName = {log}
appender.file.append = true
appender.file.layout.type = PatternLayout
appender.file.layout.pattern = %d{{ISO8601}} %-5p [%t] %c{{1}} - %m%n
rootLogger.level = info
rootLogger.appenderRef.file.ref = file
"""


class ServerState(enum.Enum):
    """Where an :class:`EmbeddedZooKeeper` is in its life (transitions in the module doc)."""

    NEW = "new"
    RUNNING = "running"
    STOPPED = "stopped"


def find_java(
    java: str | os.PathLike[str] | None = None, *, environ: Mapping[str, str] | None = None
) -> Path:
    """The ``java`` executable: ``java`` if given, else ``$JAVA_HOME/bin/java``, else ``PATH``."""
    env = os.environ if environ is None else environ
    if java is not None:
        candidates = [Path(java)]
    else:
        candidates = []
        if env.get("JAVA_HOME"):
            candidates.append(Path(env["JAVA_HOME"]) / "bin" / "java")
        on_path = shutil.which("java", path=env.get("PATH", ""))
        if on_path:
            candidates.append(Path(on_path))
    for candidate in candidates:
        if candidate.is_file() and os.access(candidate, os.X_OK):
            return candidate
    looked = ", ".join(str(c) for c in candidates) or "JAVA_HOME and PATH"
    raise JavaNotFound(
        f"no java executable found (looked at {looked}); install Java 17 or later "
        "(e.g. apt-get install openjdk-17-jre-headless) or set JAVA_HOME"
    )


def default_jar_dirs() -> list[Path]:
    """Where the server classes are looked for by default: pyspark's jars, then Debian's."""
    dirs: list[Path] = []
    spec = importlib.util.find_spec("pyspark")
    if spec is not None and spec.origin is not None:
        dirs.append(Path(spec.origin).parent / "jars")
    dirs.append(DEBIAN_JAR_DIRS[0])
    return dirs


def find_classpath(jar_dirs: Sequence[str | os.PathLike[str]] | None = None) -> str:
    """A Java class path holding the ZooKeeper server: the first directory with its jar wins.

    A directory qualifies when it (or, for Debian's layout, a subdirectory) holds
    ``zookeeper-<version>.jar`` or ``zookeeper.jar``.
    """
    dirs = default_jar_dirs() if jar_dirs is None else [Path(d) for d in jar_dirs]
    for directory in dirs:
        jars = _zookeeper_jars(directory)
        if not jars:
            continue
        entries = sorted({f"{jar.parent}/*" for jar in jars})
        if directory == DEBIAN_JAR_DIRS[0] and DEBIAN_JAR_DIRS[1].is_dir():
            entries.append(f"{DEBIAN_JAR_DIRS[1]}/*")
        return os.pathsep.join(entries)
    looked = ", ".join(str(d) for d in dirs) or "nowhere (no directories given)"
    raise ZooKeeperJarsNotFound(
        f"no ZooKeeper server jar found (looked in {looked}); {_INSTALL_HINT}"
    )


def free_port(host: str = HOST) -> int:
    """A TCP port that is free on ``host`` right now (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        port: int = sock.getsockname()[1]
        return port


class EmbeddedZooKeeper:
    """A standalone ZooKeeper server in a child JVM, bound to ``127.0.0.1``.

    Nothing happens until :meth:`start` (or ``with``). The arguments override discovery:
    ``port`` (default: a free one), ``data_dir`` (default: a temporary directory, removed on
    stop; a given one is kept), ``java`` (path of the executable), ``jar_dirs`` (directories
    to look for the server jars in, in order), ``startup_timeout`` (seconds), ``tick_time``
    (milliseconds; sessions may last 2 to 20 ticks).
    """

    def __init__(
        self,
        *,
        port: int | None = None,
        data_dir: str | os.PathLike[str] | None = None,
        java: str | os.PathLike[str] | None = None,
        jar_dirs: Sequence[str | os.PathLike[str]] | None = None,
        startup_timeout: float = 20.0,
        stop_timeout: float = 10.0,
        tick_time: int = 2000,
        die_with_parent: bool = False,
    ) -> None:
        self._requested_port = port
        self._requested_data_dir = Path(data_dir) if data_dir is not None else None
        self._java = java
        self._jar_dirs = jar_dirs
        self._startup_timeout = startup_timeout
        self._stop_timeout = stop_timeout
        self._tick_time = tick_time
        self._die_with_parent = die_with_parent
        self._state = ServerState.NEW
        self._process: subprocess.Popen[bytes] | None = None
        self._port: int | None = None
        self._data_dir: Path | None = None
        self._temporary = False
        self.startup_seconds: float | None = None

    # -- public API -------------------------------------------------------------------------

    @property
    def state(self) -> ServerState:
        """NEW, RUNNING or STOPPED."""
        return self._state

    @property
    def port(self) -> int:
        """The client port (EmbeddedServerError before start)."""
        if self._port is None:
            raise EmbeddedServerError("the embedded ZooKeeper server has not been started")
        return self._port

    @property
    def address(self) -> str:
        """``host:port`` for clients."""
        return f"{HOST}:{self.port}"

    @property
    def pid(self) -> int | None:
        """The server's process id while it has one."""
        return self._process.pid if self._process is not None else None

    def exit_status(self) -> int | None:
        """The server's exit status if its process ended on its own (None while it runs)."""
        return self._process.poll() if self._process is not None else None

    @property
    def data_dir(self) -> Path:
        """The data directory (EmbeddedServerError before start)."""
        if self._data_dir is None:
            raise EmbeddedServerError("the embedded ZooKeeper server has not been started")
        return self._data_dir

    @property
    def log_path(self) -> Path:
        """The file the server's log and output go to."""
        return self.data_dir / LOG_NAME

    def start(self) -> EmbeddedZooKeeper:
        """Start the server and wait until it serves; returns self. Raises EmbeddedServerError."""
        if self._state is not ServerState.NEW:
            raise EmbeddedServerError(f"cannot start a server that is {self._state.value}")
        java = find_java(self._java)
        classpath = find_classpath(self._jar_dirs)
        self._port = self._claim_port()
        began = time.monotonic()
        try:
            self._data_dir = self._make_data_dir()
            for attempt in range(_PORT_ATTEMPTS if self._requested_port is None else 1):
                try:
                    self._spawn(java, classpath)
                    self._await_serving(began + self._startup_timeout)
                    break
                except AddressInUse:
                    # A free port picked by the OS was taken before the JVM bound it.
                    self._kill()
                    if attempt + 1 >= _PORT_ATTEMPTS or self._requested_port is not None:
                        raise
                    self._port = free_port()
        except BaseException:
            self.stop()
            raise
        self.startup_seconds = time.monotonic() - began
        self._state = ServerState.RUNNING
        return self

    def stop(self) -> None:
        """Stop the server (SIGTERM, then SIGKILL) and remove a temporary data dir; idempotent."""
        self._kill()
        if self._temporary and self._data_dir is not None:
            shutil.rmtree(self._data_dir, ignore_errors=True)
        self._state = ServerState.STOPPED

    def detach(self) -> int:
        """Leave the server running after this object and this interpreter are gone.

        Returns its pid; stop it later with :func:`stop_detached` on its data directory.
        """
        if self._state is not ServerState.RUNNING or self._process is None:
            raise EmbeddedServerError(f"cannot detach a server that is {self._state.value}")
        pid = self._process.pid
        _RUNNING.pop(id(self), None)
        self._process = None
        self._temporary = False
        self._state = ServerState.STOPPED
        return pid

    def log_tail(self, lines: int = 30) -> str:
        """The last ``lines`` lines of the server's log ('' when there is none)."""
        try:
            text = self.log_path.read_text(errors="replace")
        except (OSError, EmbeddedServerError):
            return ""
        return "\n".join(text.splitlines()[-lines:])

    def __enter__(self) -> EmbeddedZooKeeper:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        where = f" {self.address}" if self._port is not None else ""
        return f"<EmbeddedZooKeeper {self._state.value}{where} pid={self.pid}>"

    # -- private helpers --------------------------------------------------------------------

    def _kill(self) -> None:
        process, self._process = self._process, None
        if process is not None:
            _terminate(process, self._stop_timeout)
            _RUNNING.pop(id(self), None)

    def _claim_port(self) -> int:
        if self._requested_port is None:
            return free_port()
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
            # As the JVM binds: SO_REUSEADDR on, so only a live listener makes the port taken.
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                sock.bind((HOST, self._requested_port))
            except OSError as exc:
                if exc.errno == errno.EADDRINUSE:
                    raise _port_in_use(self._requested_port) from exc
                raise EmbeddedServerError(f"cannot use port {self._requested_port}: {exc}") from exc
        return self._requested_port

    def _make_data_dir(self) -> Path:
        if self._requested_data_dir is None:
            self._temporary = True
            return Path(tempfile.mkdtemp(prefix="silbo-zookeeper-"))
        self._requested_data_dir.mkdir(parents=True, exist_ok=True)
        return self._requested_data_dir

    def _spawn(self, java: Path, classpath: str) -> None:
        data_dir = self.data_dir
        config = data_dir / "zoo.cfg"
        config.write_text(self._config_text())
        log4j = data_dir / "log4j2.properties"
        log4j.write_text(_LOG4J2.format(log=self.log_path))
        command = [
            str(java),
            *JVM_OPTIONS,
            f"-Dlog4j2.configurationFile={log4j}",
            f"-Dzookeeper.log.dir={data_dir}",
            "-Dzookeeper.admin.enableServer=false",
            "-Dzookeeper.4lw.commands.whitelist=*",
            "-cp",
            classpath,
            MAIN_CLASS,
            str(config),
        ]
        with open(self.log_path, "wb") as log:  # a fresh log per attempt
            self._process = subprocess.Popen(
                command,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=subprocess.STDOUT,
                cwd=data_dir,
                start_new_session=True,  # Ctrl-C reaches the parent only; it stops us in order
                preexec_fn=die_with_parent if self._die_with_parent else None,
            )
        (data_dir / "zookeeper.pid").write_text(f"{self._process.pid}\n")
        _RUNNING[id(self)] = self

    def _config_text(self) -> str:
        return (
            f"dataDir={self.data_dir / 'data'}\n"
            f"clientPort={self.port}\n"
            f"clientPortAddress={HOST}\n"
            f"tickTime={self._tick_time}\n"
            "maxClientCnxns=0\n"
            "admin.enableServer=false\n"
            "4lw.commands.whitelist=*\n"
        )

    def _await_serving(self, deadline: float) -> None:
        assert self._process is not None
        while True:
            code = self._process.poll()
            if code is not None:
                tail = self.log_tail()
                if "Address already in use" in tail:
                    raise _port_in_use(self.port)
                raise ServerStartTimeout(
                    f"the ZooKeeper server exited with status {code} while starting "
                    f"(log: {self.log_path})",
                    log_tail=tail,
                )
            if _serving(self.port):
                return
            if time.monotonic() >= deadline:
                raise ServerStartTimeout(
                    f"the ZooKeeper server did not answer on {self.address} within "
                    f"{self._startup_timeout:g} s (log: {self.log_path})",
                    log_tail=self.log_tail(),
                )
            time.sleep(0.05)


def _zookeeper_jars(directory: Path) -> list[Path]:
    if not directory.is_dir():
        return []
    patterns = ("zookeeper-[0-9]*.jar", "zookeeper.jar")
    found = [jar for pattern in patterns for jar in directory.glob(pattern)]
    if not found:  # Debian: /usr/share/zookeeper/lib/... or similar, one level down
        found = [jar for pattern in patterns for jar in directory.glob(f"*/{pattern}")]
    return found


def _serving(port: int) -> bool:
    """Whether the server on ``port`` answers ``srvr`` as serving (standalone or leader)."""
    try:
        with socket.create_connection((HOST, port), timeout=1.0) as sock:
            sock.sendall(b"srvr")
            reply = b""
            while chunk := sock.recv(4096):
                reply += chunk
    except OSError:
        return False
    return b"Mode:" in reply


def _terminate(process: subprocess.Popen[bytes], timeout: float) -> None:
    """SIGTERM the process group, SIGKILL it after ``timeout`` seconds, and reap the child."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, sig)
        try:
            process.wait(timeout=timeout)
            return
        except subprocess.TimeoutExpired:
            continue
    process.wait()


def die_with_parent() -> None:
    """In a child between fork and exec: ask Linux to SIGKILL it when its parent dies.

    Used for processes that must never outlive a foreground supervisor, even one killed with
    SIGKILL (which it cannot catch). A no-op where prctl is not available.
    """
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):
        pass


def stop_detached(data_dir: str | os.PathLike[str], timeout: float = 10.0) -> bool:
    """Stop the server a detached :class:`EmbeddedZooKeeper` left running in ``data_dir``.

    The pid comes from ``<data dir>/zookeeper.pid`` and is only signalled if that process is
    still a ZooKeeper JVM using this data directory (a recycled pid is left alone). Returns
    whether a server was stopped.
    """
    pid_file = Path(data_dir) / "zookeeper.pid"
    try:
        pid = int(pid_file.read_text().strip())
    except (OSError, ValueError):
        return False
    command = command_line(pid)
    if MAIN_CLASS not in command or not (
        str(Path(data_dir).resolve()) in command or str(data_dir) in command
    ):
        return False
    deadline = time.monotonic() + timeout
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(pid, sig)
        while time.monotonic() < deadline or sig == signal.SIGKILL:
            if not running(pid):
                pid_file.unlink(missing_ok=True)
                return True
            time.sleep(0.05)
            if sig == signal.SIGKILL and time.monotonic() > deadline + 5:
                break
    return False


# Servers started and not yet stopped, so that interpreter exit stops them (last resort).
_RUNNING: dict[int, EmbeddedZooKeeper] = {}


@atexit.register
def _stop_all() -> None:
    for server in list(_RUNNING.values()):
        server.stop()


def _port_in_use(port: int) -> AddressInUse:
    return AddressInUse(
        f"port {port} is already in use; choose another or let Silbo pick one", port=port
    )
