"""``agl``: serve a store or the LLM proxy, run runners, inspect a store, check readiness, dev-run and train an agent.

Importing this package stays light: every command imports what it needs (server, store backends, rich) when it runs.
A store is named by URL (``http://127.0.0.1:4747``, served by ``agl store``) or by SQLite file path.
"""

from __future__ import annotations

import os
import sys

# Importing the command modules registers their commands on the app.
from agentlightning.cli import _inspect, _runners, _serve, _train  # noqa: F401  # pyright: ignore[reportUnusedImport]
from agentlightning.cli._common import TOKEN_ENV, app

__all__ = ["TOKEN_ENV", "app", "main"]


def main() -> None:
    """Console entry point of ``agl``."""
    # The current directory is importable, as with `python -m`, so `--agent my_agent:solve` finds ./my_agent.py.
    if "" not in sys.path and os.getcwd() not in sys.path:
        sys.path.insert(0, os.getcwd())
    from agentlightning.extras import MissingExtraError

    try:
        app()
    except MissingExtraError as exc:
        # What to install is the whole message; a traceback would bury it.
        print(f"agl: {exc}", file=sys.stderr)
        raise SystemExit(1) from None
