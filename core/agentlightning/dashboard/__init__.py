"""The web dashboard of the store server: rollouts, span trees, resources, reward curves, training metrics, workers.

``create_app`` calls :func:`mount_dashboard`, so every store server serves it at ``/``. The pages are plain HTML,
CSS and ES modules shipped in this package (``static/``; no Node.js, no build step) that poll read-only JSON
endpoints under ``/v1/dashboard/…`` every :data:`REFRESH_S` seconds. Those endpoints sit behind the store's bearer
token like the rest of ``/v1``; the pages ask for the token once and keep it in the browser tab's session storage.
"""

from __future__ import annotations

from agentlightning.extras import require_server_extra

require_server_extra("the dashboard (agentlightning.dashboard)")

from fastapi import FastAPI

from agentlightning.adapter import TraceAdapter
from agentlightning.dashboard._api import PREFIX, REFRESH_S, add_dashboard_routes
from agentlightning.dashboard._assets import STATIC_DIR, DashboardAssets
from agentlightning.store.base import LightningStore

__all__ = ["PREFIX", "REFRESH_S", "STATIC_DIR", "mount_dashboard"]


def mount_dashboard(app: FastAPI, store: LightningStore, *, adapter: TraceAdapter | None = None) -> None:
    """Serve the dashboard pages at ``/`` and their JSON under ``/v1/dashboard``; ``adapter`` marks transitions."""
    add_dashboard_routes(app, store, adapter or TraceAdapter(include_messages=False))
    app.add_middleware(DashboardAssets)
