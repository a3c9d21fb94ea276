"""Idempotency keys: a retried request (same ``Idempotency-Key``) gets the first answer instead of acting twice.

The client retries on connection errors and 5xx. Without this, a retried enqueue whose first answer was lost would
enqueue twice, and a retried claim/start/finish would claim a second rollout or fail with 409 on its own success.
Keys live in memory, so they survive retries, not server restarts; the cache holds the most recent answers.
"""

from __future__ import annotations

import asyncio
from collections import OrderedDict
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Final

from starlette.responses import Response

DEFAULT_CAPACITY: Final = 65_536


@dataclass(frozen=True, slots=True)
class _Answer:
    status: int
    body: bytes
    media_type: str | None


class IdempotencyCache:
    """Answers of keyed requests, most recent ``capacity`` kept; concurrent duplicates wait for the first."""

    def __init__(self, capacity: int = DEFAULT_CAPACITY) -> None:
        self._capacity = capacity
        self._done: OrderedDict[str, _Answer] = OrderedDict()
        self._running: dict[str, asyncio.Future[_Answer]] = {}

    async def run(self, key: str | None, compute: Callable[[], Awaitable[Response]]) -> Response:
        """Answer with ``compute()`` once per key; without a key, just compute."""
        if not key:
            return await compute()
        answer = self._done.get(key)
        if answer is not None:
            self._done.move_to_end(key)
            return Response(answer.body, status_code=answer.status, media_type=answer.media_type)
        running = self._running.get(key)
        if running is not None:
            # shield: a duplicate giving up (client disconnect) must not cancel the first request's work
            try:
                answer = await asyncio.shield(running)
            except asyncio.CancelledError:
                if not running.cancelled():
                    raise
                return await self.run(key, compute)  # the first request was abandoned: this one does the work
            return Response(answer.body, status_code=answer.status, media_type=answer.media_type)
        future: asyncio.Future[_Answer] = asyncio.get_running_loop().create_future()
        self._running[key] = future
        try:
            response = await compute()
        except Exception as exc:
            # Errors are not remembered: a retry of a failed request runs again (only success must not repeat).
            future.set_exception(exc)
            future.exception()  # mark retrieved: nobody may be waiting, and asyncio would log it
            raise
        except BaseException:
            future.cancel()
            raise
        finally:
            self._running.pop(key, None)
        answer = _Answer(response.status_code, bytes(response.body), response.media_type)
        future.set_result(answer)
        self._done[key] = answer
        if len(self._done) > self._capacity:
            self._done.popitem(last=False)
        return response
