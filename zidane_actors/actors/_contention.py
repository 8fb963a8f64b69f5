"""Retrying a conditional write that lost a race to another writer.

A write made over a ``rev`` is refused when another process wrote first; the
loser reads again and retries. Retrying at once lets the same, faster
writers win again and again (a slow process could lose every attempt), so
every retry after the first waits a random time that doubles per attempt
("full jitter"): the writers spread out and each gets its turn.
"""

from __future__ import annotations

import random
from typing import Final

import trio

STALE_ATTEMPTS: Final = 32
"""Attempts of a conditional write before its last refusal is raised (under 5 s of waits)."""

_FIRST_WAIT: Final = 0.001
_LONGEST_WAIT: Final = 0.2
_jitter = random.Random()


async def back_off(lost: int) -> None:
    """Wait after losing attempt ``lost`` (from 0): a random time up to 1, 2, 4 ms… 0.2 s."""
    await trio.sleep(_jitter.uniform(0, min(_LONGEST_WAIT, _FIRST_WAIT * 2**lost)))
