"""Send-request idempotency records and schedule constants."""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from typing import Final

from ._codec import encode
from ._types import SendRequestRecord

__all__ = [
    "FIRE_HISTORY",
    "SEND_REQUEST_HISTORY",
    "send_request_evictions",
    "send_request_fingerprint",
]

SEND_REQUEST_HISTORY: Final = 256
"""Request ids kept per session; a claim past it drops the oldest."""

FIRE_HISTORY: Final = 50
"""Fires kept per schedule; recording one past it drops the oldest."""


def send_request_fingerprint(content: object) -> str:
    """SHA-256 of a send's JSON content: the same request id with other content is refused."""
    return hashlib.sha256(encode(content)).hexdigest()


def send_request_evictions(
    records: Sequence[SendRequestRecord], limit: int = SEND_REQUEST_HISTORY
) -> list[str]:
    """Request ids to drop, oldest ``createdAt`` first, so one more claim fits in ``limit``."""
    excess = len(records) + 1 - limit
    if excess <= 0:
        return []
    ordered = sorted(range(len(records)), key=lambda i: records[i].created_at)
    return [records[i].request_id for i in ordered[:excess]]
