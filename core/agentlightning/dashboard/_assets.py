"""Serves the dashboard's static pages (HTML, JS, CSS shipped in the package) ahead of the store's auth check."""

from __future__ import annotations

from pathlib import Path
from typing import Final

from starlette.types import ASGIApp, Receive, Scope, Send

STATIC_DIR: Final = Path(__file__).parent / "static"
ASSETS_PREFIX: Final = "/dashboard/"
_TYPES: Final = {
    ".html": "text/html; charset=utf-8",
    ".js": "text/javascript; charset=utf-8",
    ".css": "text/css; charset=utf-8",
    ".svg": "image/svg+xml",
}
# The pages render every value with textContent, and this policy forbids inline and foreign scripts as a second
# line of defence: span attributes hold model output, which is untrusted text.
_SECURITY_HEADERS: Final = [
    (
        b"content-security-policy",
        b"default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; connect-src 'self'; "
        b"frame-ancestors 'none'; base-uri 'none'; form-action 'none'",
    ),
    (b"x-content-type-options", b"nosniff"),
    (b"referrer-policy", b"no-referrer"),
    # Always revalidate: after an upgrade the browser must not mix old scripts with a new API.
    (b"cache-control", b"no-cache"),
]


def _asset_table() -> dict[str, tuple[Path, bytes]]:
    """URL path → (file, content type) for every shipped asset; only these paths are served (no traversal)."""
    table: dict[str, tuple[Path, bytes]] = {}
    for file in sorted(STATIC_DIR.rglob("*")):
        content_type = _TYPES.get(file.suffix)
        if file.is_file() and content_type is not None:
            table[ASSETS_PREFIX + file.relative_to(STATIC_DIR).as_posix()] = (file, content_type.encode())
    index = STATIC_DIR / "index.html"
    table["/"] = (index, _TYPES[".html"].encode())
    return table


class DashboardAssets:
    """ASGI middleware answering ``GET /`` and ``GET /dashboard/…`` from the package; everything else passes on.

    It sits outside the store's bearer-token check on purpose: the pages hold no data (they fetch it from
    ``/v1/dashboard/…`` with the token the user types in), and a browser cannot attach a bearer token to the
    request that loads a page.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self._assets = _asset_table()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Serve a known asset, or hand the request to the store app."""
        asset = self._assets.get(scope["path"]) if scope["type"] == "http" else None
        if asset is None or scope["method"] not in ("GET", "HEAD"):
            await self.app(scope, receive, send)
            return
        file, content_type = asset
        body = file.read_bytes()  # a few small files, read per request so an edited asset shows on reload
        headers = [(b"content-type", content_type), (b"content-length", str(len(body)).encode()), *_SECURITY_HEADERS]
        await send({"type": "http.response.start", "status": 200, "headers": headers})
        await send({"type": "http.response.body", "body": b"" if scope["method"] == "HEAD" else body})
