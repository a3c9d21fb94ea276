"""Splitting a server-sent-events byte stream into whole events."""

from __future__ import annotations

import re

# Events end with a blank line; servers use LF or CRLF line ends.
_EVENT_END = re.compile(rb"\r?\n\r?\n")


def split_events(buffer: bytes) -> tuple[list[bytes], bytes]:
    """Whole events in ``buffer`` (without their terminating blank line) and the incomplete rest."""
    events: list[bytes] = []
    start = 0
    for match in _EVENT_END.finditer(buffer):
        events.append(buffer[start : match.start()].replace(b"\r\n", b"\n"))
        start = match.end()
    return events, buffer[start:]
