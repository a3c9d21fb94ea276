"""Fixtures of the scale tests: one throwaway PostgreSQL server per session, and store server processes."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from agentlightning.testing.postgres import PostgresCluster
from agentlightning.testing.store_server import StoreServerProcess


@pytest.fixture(scope="session")
def pg_cluster() -> Iterator[PostgresCluster]:
    """A throwaway PostgreSQL server for the session (installed first if missing and we are root)."""
    with PostgresCluster() as cluster:
        yield cluster


def server_for(backend: str, request: pytest.FixtureRequest, tmp_path: Path) -> StoreServerProcess:
    """A (not yet started) store server process on a fresh SQLite file or PostgreSQL schema."""
    if backend == "sqlite":
        return StoreServerProcess("sqlite", path=str(tmp_path / "store.db"))
    cluster: PostgresCluster = request.getfixturevalue("pg_cluster")
    return StoreServerProcess("postgres", dsn=cluster.create_schema())


@pytest.fixture(params=["sqlite", "postgres"])
def server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreServerProcess]:
    """A store server process (started by the test) on each durable backend; stopped after the test."""
    process = server_for(request.param, request, tmp_path)
    yield process
    process.stop()


@pytest.fixture
def pg_server(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[StoreServerProcess]:
    """A started store server process on PostgreSQL."""
    process = server_for("postgres", request, tmp_path).start()
    yield process
    process.stop()
