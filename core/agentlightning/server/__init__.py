"""The LightningStore over HTTP: REST under ``/v1/…``, OTLP/HTTP trace ingest, auth, limits, health and metrics.

``create_app(store)`` builds the FastAPI app, ``serve_store(...)`` runs it (what ``agl store`` calls) and
``StoreServer(store)`` runs it on a background thread for tests and embedding. Both run the store's watchdog
(every :data:`DEFAULT_WATCHDOG_INTERVAL_S` seconds unless told otherwise), so timeouts hold with no trainer
running. The matching client is :class:`agentlightning.client.LightningStoreClient`.
"""

from agentlightning.extras import require_server_extra

require_server_extra("the store server (agentlightning.server)")

from agentlightning.client import TOKEN_ENV
from agentlightning.server._app import (
    DEFAULT_MAX_BODY_BYTES,
    DEFAULT_MAX_SPANS_PER_REQUEST,
    DEFAULT_MAX_WAIT_S,
    create_app,
)
from agentlightning.server._run import (
    DEFAULT_WATCHDOG_INTERVAL_S,
    StoreServer,
    is_loopback,
    serve_store,
)

__all__ = [
    "DEFAULT_MAX_BODY_BYTES",
    "DEFAULT_MAX_SPANS_PER_REQUEST",
    "DEFAULT_MAX_WAIT_S",
    "DEFAULT_WATCHDOG_INTERVAL_S",
    "TOKEN_ENV",
    "StoreServer",
    "create_app",
    "is_loopback",
    "serve_store",
]
