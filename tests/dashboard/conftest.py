"""A seeded store server and one headless Chromium for the dashboard tests (skipped when Chromium is missing)."""

from __future__ import annotations

import asyncio
import os
import shutil
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import pytest

from agentlightning.server import StoreServer
from agentlightning.store.sqlite import SqliteLightningStore
from tests.dashboard._seed import Seeded, seed_store

CHROMIUM_ENV = "AGENTLIGHTNING_CHROMIUM"
_SCREENSHOTS: list[Path] = []  # the session's screenshot folder, under pytest's tmp_path (never in the repo)
# The flags the CI sandbox needs: no setuid sandbox as root, no GPU, and nothing that phones home.
CHROMIUM_FLAGS = [
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
]


def chromium_path() -> str | None:
    """The Chromium binary: $AGENTLIGHTNING_CHROMIUM, else Debian's /usr/bin/chromium, else one on PATH."""
    for candidate in (os.environ.get(CHROMIUM_ENV), "/usr/bin/chromium", shutil.which("chromium")):
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    return None


@pytest.fixture(scope="session", autouse=True)
def screenshot_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Where :func:`screenshot` saves: a folder under pytest's basetemp."""
    directory = tmp_path_factory.mktemp("screenshots")
    _SCREENSHOTS[:] = [directory]
    return directory


@pytest.fixture(scope="module")
def seeded_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[StoreServer, Seeded]]:
    """A store server on loopback over a seeded SQLite store."""
    path = tmp_path_factory.mktemp("dashboard") / "store.db"
    # On a thread of its own: Playwright's sync API keeps an event loop running on this one.
    with ThreadPoolExecutor(1) as pool:
        seeded = pool.submit(lambda: asyncio.run(seed_store(path))).result()
    with StoreServer(lambda: SqliteLightningStore(path)) as server:
        yield server, seeded


@pytest.fixture(scope="module")
def browser() -> Iterator[Any]:
    """One headless Chromium for the module (Playwright drives Debian's binary; no browser download)."""
    executable = chromium_path()
    if executable is None:
        pytest.skip(
            "Chromium is not installed: run scripts/ensure_chromium.sh (apt-get install chromium) "
            f"or set {CHROMIUM_ENV} to a Chromium binary"
        )
    sync_api = pytest.importorskip("playwright.sync_api", reason="pip install playwright (see requirements-dev.txt)")
    with sync_api.sync_playwright() as playwright:
        launched = playwright.chromium.launch(executable_path=executable, args=CHROMIUM_FLAGS, headless=True)
        try:
            yield launched
        finally:
            launched.close()


@pytest.fixture
def page(browser: Any) -> Iterator[Any]:
    """A fresh 1400x900 page; browser console errors fail the test."""
    context = browser.new_context(viewport={"width": 1400, "height": 900})
    page = context.new_page()
    errors: list[str] = []
    # 401s are the token test's expected refusals; any other console error is a bug in the pages.
    page.on(
        "console",
        lambda message: (
            errors.append(message.text) if message.type == "error" and "status of 401" not in message.text else None
        ),
    )
    page.on("pageerror", lambda error: errors.append(str(error)))
    page.set_default_timeout(10_000)
    try:
        yield page
    finally:
        context.close()
    assert errors == [], f"errors in the browser console: {errors}"


def screenshot(page: Any, name: str) -> Path:
    """Save a full-page screenshot in the session's screenshot folder (see :func:`screenshot_dir`)."""
    path = _SCREENSHOTS[0] / f"{name}.png"
    page.evaluate("() => window.scrollTo(0, 0)")  # the sticky header belongs at the top of a full-page shot
    page.screenshot(path=str(path), full_page=True)
    return path
