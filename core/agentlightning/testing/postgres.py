"""A throwaway PostgreSQL cluster for tests and benchmarks: ``initdb`` in a temp dir, one server on a loopback port.

``with PostgresCluster() as cluster: dsn = cluster.create_database()`` — each database is fresh and empty. The
server binaries come from ``AGL_PG_BIN`` (a folder holding ``initdb`` and ``postgres``), ``pg_config --bindir``,
``PATH`` or Debian's ``/usr/lib/postgresql/<version>/bin``; when none has them and we are root,
``scripts/ensure_postgres.sh`` installs Debian's ``postgresql`` package. PostgreSQL refuses to run as root, so as
root the cluster runs as the ``postgres`` user (created if missing). The cluster is tuned for speed, not for
durability (``fsync=off``): tests kill the *store server*, never the database.
"""

from __future__ import annotations

import contextlib
import glob
import os
import pwd
import shutil
import signal
import socket
import subprocess
import tempfile
import time
import uuid
from pathlib import Path
from types import TracebackType
from typing import Any, Final

BIN_ENV: Final = "AGL_PG_BIN"
_SERVICE_USER: Final = "postgres"
_ENSURE_SCRIPT: Final = Path(__file__).resolve().parents[3] / "scripts" / "ensure_postgres.sh"
# Speed over durability, and room for many pools (tests open a store per test; benches run several servers).
_SERVER_SETTINGS: Final = {
    "listen_addresses": "127.0.0.1",
    "fsync": "off",
    "synchronous_commit": "off",
    "full_page_writes": "off",
    "max_connections": "300",
    "shared_buffers": "64MB",
    "log_min_messages": "warning",
}


def find_postgres_bin() -> Path | None:
    """The folder holding ``initdb`` and ``postgres``, or None when PostgreSQL is not installed."""
    candidates: list[str] = []
    if os.environ.get(BIN_ENV):
        candidates.append(os.environ[BIN_ENV])
    with contextlib.suppress(OSError, subprocess.CalledProcessError):
        candidates.append(subprocess.run(["pg_config", "--bindir"], capture_output=True, text=True, check=True).stdout)
    initdb = shutil.which("initdb")
    if initdb:
        candidates.append(os.path.dirname(initdb))
    candidates += sorted(glob.glob("/usr/lib/postgresql/*/bin"), key=_version_key, reverse=True)
    for folder in candidates:
        path = Path(folder.strip())
        if (path / "initdb").is_file() and (path / "postgres").is_file():
            return path
    return None


def _version_key(folder: str) -> int:
    digits = "".join(ch for ch in Path(folder).parent.name if ch.isdigit())
    return int(digits or 0)


def ensure_postgres_bin() -> Path:
    """The PostgreSQL server binaries, installing Debian's package first (as root) when they are missing."""
    found = find_postgres_bin()
    if found is not None:
        return found
    if os.geteuid() == 0 and _ENSURE_SCRIPT.is_file():
        subprocess.run(["bash", str(_ENSURE_SCRIPT)], check=True, timeout=900)
        found = find_postgres_bin()
        if found is not None:
            return found
    raise RuntimeError(
        "PostgreSQL server binaries (initdb, postgres) not found. Install them (Debian: `bash "
        "scripts/ensure_postgres.sh`, or `apt-get install -y postgresql`), or point "
        f"{BIN_ENV} at the folder holding initdb"
    )


def free_port() -> int:
    """A TCP port that was free on 127.0.0.1 a moment ago."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return int(probe.getsockname()[1])


def _service_user() -> pwd.struct_passwd:
    """The unprivileged user the server runs as when we are root (created if missing)."""
    try:
        return pwd.getpwnam(_SERVICE_USER)
    except KeyError:
        subprocess.run(
            ["useradd", "--system", "--no-create-home", "--shell", "/usr/sbin/nologin", _SERVICE_USER],
            check=True,
            capture_output=True,
        )
        return pwd.getpwnam(_SERVICE_USER)


class PostgresCluster:
    """One PostgreSQL server on a throwaway data directory; ``stop()`` removes everything."""

    def __init__(self, *, port: int | None = None, settings: dict[str, str] | None = None) -> None:
        """Prepare (not start) a cluster on ``port`` (a free one by default) with extra server ``settings``."""
        self.port = port or free_port()
        self.settings = {**_SERVER_SETTINGS, **(settings or {})}
        self.root: Path | None = None
        self._process: subprocess.Popen[Any] | None = None
        self._run_as: dict[str, Any] = {}

    @property
    def dsn(self) -> str:
        """DSN of the maintenance database ``postgres`` (superuser ``postgres``, trust auth on loopback)."""
        return self.dsn_for("postgres")

    @property
    def pid(self) -> int | None:
        """Process id of the server (the postmaster), or None when it is not running."""
        return None if self._process is None else self._process.pid

    def dsn_for(self, database: str) -> str:
        """DSN of ``database`` on this cluster."""
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def start(self, timeout_s: float = 60.0) -> PostgresCluster:
        """initdb and start the server; returns once it accepts connections."""
        bindir = ensure_postgres_bin()
        self.root = Path(tempfile.mkdtemp(prefix="agl-pg-"))
        data, sockets = self.root / "data", self.root / "sock"
        sockets.mkdir()
        if os.geteuid() == 0:
            user = _service_user()
            self._run_as = {"user": user.pw_uid, "group": user.pw_gid, "extra_groups": []}
            os.chmod(self.root, 0o755)  # mkdtemp makes it 0700: the service user must reach data/ below it
            for path in (self.root, sockets):
                os.chown(path, user.pw_uid, user.pw_gid)
        initdb = [str(bindir / "initdb"), "-D", str(data), "-U", "postgres", "--auth=trust", "-E", "UTF8"]
        result = subprocess.run([*initdb, "--no-sync"], capture_output=True, text=True, **self._run_as)
        if result.returncode != 0:
            raise RuntimeError(f"initdb failed ({result.returncode}): {result.stderr.strip()}")
        command = [str(bindir / "postgres"), "-D", str(data), "-p", str(self.port), "-k", str(sockets)]
        for key, value in self.settings.items():
            command += ["-c", f"{key}={value}"]
        log = open(self.root / "server.log", "wb")  # noqa: SIM115 - the server writes to it until stop()
        self._process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, **self._run_as)
        log.close()
        self._wait_ready(timeout_s)
        return self

    def _wait_ready(self, timeout_s: float) -> None:
        import psycopg

        deadline = time.monotonic() + timeout_s
        while True:
            try:
                psycopg.connect(self.dsn, connect_timeout=2).close()
                return
            except psycopg.OperationalError as exc:
                assert self._process is not None
                if self._process.poll() is not None or time.monotonic() > deadline:
                    self.stop()
                    raise RuntimeError(
                        f"PostgreSQL did not start on port {self.port}: {exc}; log: {self.log()}"
                    ) from exc
                time.sleep(0.1)

    def log(self) -> str:
        """The server's log so far (for error messages)."""
        if self.root is None or not (self.root / "server.log").exists():
            return ""
        return (self.root / "server.log").read_text(errors="replace")[-4000:]

    def create_database(self, name: str | None = None) -> str:
        """Create a fresh empty database and return its DSN."""
        import psycopg
        from psycopg import sql

        name = name or f"agl_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.dsn, autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
        return self.dsn_for(name)

    def create_schema(self, database: str = "postgres") -> str:
        """Create a fresh empty schema and return a DSN whose ``search_path`` is it (cheaper than a database)."""
        import psycopg
        from psycopg import sql

        name = f"agl_{uuid.uuid4().hex[:12]}"
        with psycopg.connect(self.dsn_for(database), autocommit=True) as conn:
            conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        return f"{self.dsn_for(database)}?options=-csearch_path%3D{name}"

    def stop(self) -> None:
        """Stop the server (immediate shutdown) and delete the data directory; stopping twice is a no-op."""
        process, self._process = self._process, None
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGQUIT)  # "immediate" shutdown: no checkpoint, the files are deleted next
            try:
                process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        root, self.root = self.root, None
        if root is not None:
            shutil.rmtree(root, ignore_errors=True)

    def __enter__(self) -> PostgresCluster:
        """Start the cluster."""
        return self.start()

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        """Stop the cluster and remove its files."""
        self.stop()
