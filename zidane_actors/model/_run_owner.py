"""Run owners: which process holds a stored ``running`` marker, and is it alive."""

from __future__ import annotations

import os
import secrets
from functools import cache
from typing import Final

from ._types import RunOwner, SessionStatus

__all__ = [
    "RUN_OWNER_HOLD_MS",
    "current_run_owner",
    "host_id",
    "is_run_owner_dead",
    "is_run_owner_holding",
    "process_started_at",
    "run_claim_blocked",
    "shown_session_status",
]

RUN_OWNER_HOLD_MS: Final = 10 * 60_000
"""How long a live owner on this host keeps its claim with no write (ms)."""

_START_TOLERANCE_MS: Final = 2_000


def _read(path: str) -> str:
    try:
        with open(path, encoding="ascii", errors="replace") as f:
            return f.read().strip()
    except OSError:
        return ""


@cache
def host_id() -> str:
    """Machine, pid namespace and boot of this process: pids compare only within one."""
    machine = _read("/etc/machine-id") or os.uname().nodename
    try:
        pid_ns = os.readlink("/proc/self/ns/pid")
    except OSError:
        pid_ns = "pid:?"
    boot = _read("/proc/sys/kernel/random/boot_id") or "boot:?"
    return f"{machine}/{pid_ns}/{boot}"


@cache
def _boot_time_ms() -> int | None:
    for line in _read("/proc/stat").splitlines():
        if line.startswith("btime "):
            return int(line.split()[1]) * 1000
    return None


def process_started_at(pid: int) -> int | None:
    """When process ``pid`` started, epoch ms; ``None`` when it cannot be read."""
    stat = _read(f"/proc/{pid}/stat")
    boot = _boot_time_ms()
    if not stat or boot is None:
        return None
    try:
        fields = stat[stat.rindex(")") + 2 :].split()
        ticks = int(fields[19])
    except (ValueError, IndexError):
        return None
    return boot + ticks * 1000 // os.sysconf("SC_CLK_TCK")


@cache
def _token() -> str:
    return secrets.token_hex(16)


def current_run_owner() -> RunOwner:
    """This process as a run owner."""
    pid = os.getpid()
    return RunOwner(host_id=host_id(), pid=pid, token=_token(), started_at=process_started_at(pid))


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def is_run_owner_dead(owner: RunOwner | None) -> bool:
    """True only when ``owner`` is known dead: on this host with its pid gone or reused.

    Owners on other hosts (or unknown) are never known dead.
    """
    if owner is None or owner.host_id != host_id():
        return False
    if owner.pid == os.getpid():
        return owner.token != _token()
    if not _pid_alive(owner.pid):
        return True
    if owner.started_at is None:
        return False
    started = process_started_at(owner.pid)
    return started is not None and abs(started - owner.started_at) > _START_TOLERANCE_MS


def is_run_owner_holding(owner: RunOwner | None, updated_at: int, now: int) -> bool:
    """A live owner on this host that wrote within ``RUN_OWNER_HOLD_MS``."""
    if owner is None or owner.host_id != host_id() or is_run_owner_dead(owner):
        return False
    return now - updated_at <= RUN_OWNER_HOLD_MS


def run_claim_blocked(
    status: SessionStatus | None,
    owner: RunOwner | None,
    updated_at: int,
    stale_at: int,
    now: int,
) -> bool:
    """Whether a stored ``running`` marker still holds the session against a claim.

    It holds when written after ``stale_at`` by an owner not known dead, or
    by a live owner on this host still within its hold window.
    """
    if status != "running":
        return False
    if updated_at > stale_at and not is_run_owner_dead(owner):
        return True
    return is_run_owner_holding(owner, updated_at, now)


def shown_session_status(
    status: SessionStatus | None, owner: RunOwner | None, updated_at: int, now: int
) -> str:
    """The status a reader is shown: a stored ``running`` whose owner is gone is ``stale``.

    The owner is judged by the claim rule (:func:`run_claim_blocked` with the
    ``RUN_OWNER_HOLD_MS`` horizon): on this host by its pid, elsewhere by how
    long ago the marker was written. A missing status reads as ``idle``.
    """
    if status != "running":
        return status or "idle"
    blocked = run_claim_blocked(
        status, owner, updated_at, stale_at=now - RUN_OWNER_HOLD_MS, now=now
    )
    return "running" if blocked else "stale"
