"""The one store factory: every spec form opens the backend it names; anything else is refused with the forms."""

from __future__ import annotations

import asyncio
import subprocess
import sys
from pathlib import Path

import pytest

import agentlightning.server
import agentlightning.trainer
from agentlightning.client import LightningStoreClient
from agentlightning.server._run import _store_spec  # pyright: ignore[reportPrivateUsage]
from agentlightning.store import InMemoryLightningStore, SqliteLightningStore, open_store


def test_each_spec_form_opens_its_backend(tmp_path: Path) -> None:
    for spec in ("memory:", ":memory:"):
        assert isinstance(open_store(spec), InMemoryLightningStore)
    given = InMemoryLightningStore()
    assert open_store(given) is given
    for spec, file in ((f"sqlite:///{tmp_path}/a/s.db", tmp_path / "a" / "s.db"), (tmp_path / "b" / "s.db", None)):
        store = open_store(spec)
        assert isinstance(store, SqliteLightningStore)
        asyncio.run(store.close())
        assert (file or tmp_path / "b" / "s.db").is_file()
    client = open_store("http://127.0.0.1:9/", token="secret")  # a client connects lazily: nothing is reached here
    assert isinstance(client, LightningStoreClient)
    assert client.url == "http://127.0.0.1:9" and client.token == "secret"


def test_no_spec_is_a_new_sqlite_file_under_the_run_dir(tmp_path: Path) -> None:
    store = open_store(None, run_dir=tmp_path / "runs")
    assert isinstance(store, SqliteLightningStore)
    asyncio.run(store.close())
    [created] = (tmp_path / "runs").glob("*/store.db")
    assert created.is_file()


@pytest.mark.parametrize("spec", ["redis://localhost:6379", "mongodb://h/db", "", "   "])
def test_other_specs_are_refused_with_the_forms_and_create_nothing(
    spec: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError) as raised:
        open_store(spec)
    for form in ("http(s)://", "postgresql://", "sqlite:///", "memory:"):
        assert form in str(raised.value)
    assert list(tmp_path.iterdir()) == []


def test_agl_store_options_map_to_specs_of_the_one_factory() -> None:
    assert _store_spec("sqlite", "runs/s.db", None) == "sqlite:///runs/s.db"
    assert _store_spec("sqlite", "/abs/s.db", None) == "sqlite:////abs/s.db"
    assert _store_spec("memory", None, None) == "memory:"
    assert _store_spec("postgres", None, "postgresql://u@h/db") == "postgresql://u@h/db"
    with pytest.raises(ValueError, match="not a PostgreSQL URL"):
        _store_spec("postgres", None, "u@h/db")
    with pytest.raises(ValueError, match="choose one of sqlite, memory, postgres"):
        _store_spec("mongo", None, None)


def test_there_is_one_factory_and_any_import_order_works() -> None:
    assert getattr(agentlightning.trainer, "open_store", open_store) is open_store  # used there, not redefined
    assert not hasattr(agentlightning.server, "open_store")
    for first in ("agentlightning.client", "agentlightning.store", "agentlightning.store.sqlite", "agentlightning.cli"):
        code = f"import {first}; from agentlightning.store import open_store; print(type(open_store('http://h:1')))"
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
        assert done.returncode == 0, done.stderr
        assert "LightningStoreClient" in done.stdout
