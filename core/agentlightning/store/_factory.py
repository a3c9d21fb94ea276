"""The one store factory: every place that turns a user's store spec into a store (Trainer, CLI, runner processes,
``agl store``) calls :func:`open_store`."""

from __future__ import annotations

import importlib
import os
import time
from pathlib import Path
from typing import Final

# A module, not its class: the client imports store.base, whose package imports this module, so when the client is
# imported first its class does not exist yet here; it is looked up when a URL is opened.
import agentlightning.client as store_client
from agentlightning.store.base import LightningStore
from agentlightning.store.memory import InMemoryLightningStore
from agentlightning.store.sqlite import SqliteLightningStore

StoreSpec = LightningStore | str | os.PathLike[str] | None
MEMORY_SPECS: Final = frozenset({"memory:", ":memory:"})
SPEC_FORMS: Final = (
    "http(s)://host:port (a store server), postgresql://user@host/db, sqlite:///path/store.db or a file path, "
    "or memory:"
)


def open_store(
    spec: StoreSpec, *, token: str | None = None, run_dir: str | os.PathLike[str] = "runs"
) -> LightningStore:
    """A store from ``spec``: a store as is, an ``http(s)://`` URL (a client of that server, sending ``token``), a
    ``postgresql://`` DSN, ``sqlite:///path`` or a plain SQLite path, ``memory:`` (or ``:memory:``), or None (a new
    SQLite file under ``run_dir``, named by the time). Any other ``scheme://`` raises ValueError listing these forms."""
    if isinstance(spec, LightningStore):
        return spec
    if spec is None:
        return _sqlite(Path(run_dir) / time.strftime("%Y%m%d-%H%M%S") / "store.db")
    text = os.fspath(spec)
    if not text.strip():
        raise ValueError(f"store spec is empty; use {SPEC_FORMS}")
    if text.startswith(("http://", "https://")):
        return store_client.LightningStoreClient(text, token=token)
    if text in MEMORY_SPECS:
        return InMemoryLightningStore()
    if text.startswith(("postgresql://", "postgres://")):
        return _postgres(text)
    if text.startswith("sqlite:///"):
        return _sqlite(Path(text.removeprefix("sqlite:///")))
    if "://" in text:
        # A URL of another kind would otherwise become a SQLite file named after it (postgresql:/user@host/db).
        scheme = text.split("://", 1)[0]
        raise ValueError(f"store {text!r}: unknown scheme {scheme!r}; use {SPEC_FORMS}")
    return _sqlite(Path(text))


def _sqlite(path: Path) -> LightningStore:
    path.parent.mkdir(parents=True, exist_ok=True)
    return SqliteLightningStore(path)


def _postgres(dsn: str) -> LightningStore:
    try:  # by name: psycopg is an optional dependency ([postgres] extra) and may be absent from this installation
        module = importlib.import_module("agentlightning.store.postgres")
    except ImportError as exc:
        raise ValueError(
            f'store {dsn!r} needs the PostgreSQL backend: pip install "agentlightning-core[postgres]" '
            "(or use a SQLite path on one machine)"
        ) from exc
    store: LightningStore = module.PostgresLightningStore(dsn)
    return store
