"""uvicorn's HTTP protocol with corked writes: a response's head and body leave the server in one ``send``.

uvicorn writes the status line and headers when the app sends ``http.response.start`` and the body on
``http.response.body``: two ``send`` syscalls per answer, and on loopback the client may wake twice to read it. The
store's answers are small, so this transport wrapper gathers what one event-loop turn writes and sends it at the end
of the turn (``call_soon``): one syscall, the answer delayed by one loop iteration. Closing flushes first.
"""

from __future__ import annotations

import asyncio
from typing import Any

# Raises ImportError without httptools (a dependency of the server extra); _run.py then uses uvicorn's "auto".
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol


class CorkedTransport(asyncio.Transport):
    """Delegates to ``inner``; writes made in one loop turn are joined and written once at its end."""

    def __init__(self, inner: asyncio.Transport) -> None:
        super().__init__()
        self._inner = inner
        self._pending: list[bytes] = []
        self._loop = asyncio.get_running_loop()

    def write(self, data: bytes | bytearray | memoryview) -> None:
        """Queue ``data``; the first write of a turn schedules the flush."""
        if not self._pending:
            self._loop.call_soon(self._flush)
        self._pending.append(bytes(data))

    def writelines(self, list_of_data: Any) -> None:
        """Queue every chunk."""
        for data in list_of_data:
            self.write(data)

    def _flush(self) -> None:
        if not self._pending:
            return
        data = self._pending[0] if len(self._pending) == 1 else b"".join(self._pending)
        self._pending = []
        if not self._inner.is_closing():
            self._inner.write(data)

    def close(self) -> None:
        """Send what is queued, then close."""
        self._flush()
        self._inner.close()

    def abort(self) -> None:
        """Drop what is queued and close at once."""
        self._pending = []
        self._inner.abort()

    def is_closing(self) -> bool:
        """Whether the wrapped transport is closing."""
        return self._inner.is_closing()

    def get_extra_info(self, name: str, default: Any = None) -> Any:
        """The wrapped transport's extra info (socket, peername, sslcontext, ...)."""
        return self._inner.get_extra_info(name, default)

    def pause_reading(self) -> None:
        """Pause the wrapped transport's reading."""
        self._inner.pause_reading()

    def resume_reading(self) -> None:
        """Resume the wrapped transport's reading."""
        self._inner.resume_reading()

    def is_reading(self) -> bool:
        """Whether the wrapped transport is reading."""
        return self._inner.is_reading()

    def set_write_buffer_limits(self, high: int | None = None, low: int | None = None) -> None:
        """Flow-control limits of the wrapped transport."""
        self._inner.set_write_buffer_limits(high, low)

    def get_write_buffer_size(self) -> int:
        """Bytes buffered here and in the wrapped transport."""
        return self._inner.get_write_buffer_size() + sum(len(data) for data in self._pending)

    def can_write_eof(self) -> bool:
        """Whether the wrapped transport can half-close."""
        return self._inner.can_write_eof()

    def write_eof(self) -> None:
        """Send what is queued, then half-close."""
        self._flush()
        self._inner.write_eof()

    def set_protocol(self, protocol: asyncio.BaseProtocol) -> None:
        """Set the wrapped transport's protocol."""
        self._inner.set_protocol(protocol)

    def get_protocol(self) -> asyncio.BaseProtocol:
        """The wrapped transport's protocol."""
        return self._inner.get_protocol()


class CorkedHttpProtocol(HttpToolsProtocol):
    """uvicorn's httptools protocol writing through a :class:`CorkedTransport`."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # pyright: ignore[reportIncompatibleMethodOverride] -- uvicorn narrows BaseTransport to Transport too
        """Wrap the connection's transport, then let uvicorn set the connection up."""
        super().connection_made(CorkedTransport(transport))
