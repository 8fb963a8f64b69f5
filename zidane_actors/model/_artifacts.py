"""Artifact helpers shared by every store, so merge and eviction rules cannot drift."""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import Any, Final

import msgspec
from msgspec import UNSET

from ..errors import ConflictError, ValidationError
from ._codec import encode
from ._ids import check_column_text
from ._json import check_json
from ._preview import preview
from ._types import ArtifactFilter, SessionArtifact, SessionArtifactInput

__all__ = [
    "ARTIFACTS_METADATA_KEY",
    "ARTIFACTS_PER_SESSION_CAP",
    "ARTIFACT_KINDS",
    "ARTIFACT_KIND_MAX_CHARS",
    "ARTIFACT_LABEL_MAX_CHARS",
    "ARTIFACT_META_MAX_BYTES",
    "ARTIFACT_URI_MAX_CHARS",
    "check_artifact_id_free",
    # clip_artifact_label is the session's step (actors/_plans.py), not public
    "filter_artifacts",
    "matches_artifact_filter",
    "merge_artifact",
    "normalize_artifact",
    "normalize_artifact_input",
    "select_artifact_evictions",
    "sort_artifacts",
]


class _ArtifactKinds(msgspec.Struct, frozen=True):
    branch: str = "branch"
    commit: str = "commit"
    file: str = "file"
    pull_request: str = "pull_request"


ARTIFACT_KINDS: Final = _ArtifactKinds()
"""Built-in kinds (``ARTIFACT_KINDS.pull_request == 'pull_request'``). Open set."""

ARTIFACT_META_MAX_BYTES: Final = 16_384
"""Maximum size of an artifact ``meta`` value, in bytes of its JSON encoding."""

ARTIFACTS_METADATA_KEY: Final = "artifacts"
"""Reserved tool-result metadata namespace for emitted artifacts."""

ARTIFACTS_PER_SESSION_CAP: Final = 200
"""Maximum number of artifacts kept per session."""

ARTIFACT_LABEL_MAX_CHARS: Final = 500
"""Labels longer than this are clipped (with an ellipsis)."""

ARTIFACT_URI_MAX_CHARS: Final = 4_096
"""A longer uri cannot be clipped without changing identity: the input is refused."""

ARTIFACT_KIND_MAX_CHARS: Final = 64
"""A longer kind is refused like a long uri."""


def _clean_str(value: object) -> str | None:
    if not isinstance(value, str):
        return None
    stripped = value.strip()
    return stripped or None


def normalize_artifact_input(raw: object) -> SessionArtifactInput | None:
    """Validate an untrusted artifact entry; ``None`` when it is unusable.

    Missing or non-string ``kind``/``uri``/``label`` and over-long kinds or uris
    make it unusable; a long label is clipped and an oversized or non-JSON
    ``meta`` is dropped (not the artifact).
    """
    if not isinstance(raw, dict):
        return None
    kind, uri, label = (_clean_str(raw.get(k)) for k in ("kind", "uri", "label"))
    if kind is None or uri is None or label is None:
        return None
    if len(kind) > ARTIFACT_KIND_MAX_CHARS or len(uri) > ARTIFACT_URI_MAX_CHARS:
        return None
    meta: Any = UNSET
    if "meta" in raw and raw["meta"] is not None:
        try:
            meta = _bounded_meta(raw["meta"])
        except ValidationError:
            meta = UNSET
    project_root = _clean_str(raw.get("projectRoot"))
    return SessionArtifactInput(
        kind=kind, uri=uri, label=clip_artifact_label(label), meta=meta, project_root=project_root
    )


def clip_artifact_label(label: str) -> str:
    """A producer's label clipped to :data:`ARTIFACT_LABEL_MAX_CHARS` with ``…`` (as zidane's
    ``normalizeArtifactInput``); store writes keep a label as given."""
    if len(label) > ARTIFACT_LABEL_MAX_CHARS:
        return label[: ARTIFACT_LABEL_MAX_CHARS - 1] + "…"
    return label


def _bounded_meta(meta: Any) -> Any:
    """``meta``, or ``UNSET`` when its JSON is over the byte bound; refused when not exact JSON."""
    if meta is UNSET:
        return meta
    check_json(meta, what="artifact meta", path="$.meta")
    try:
        size = len(encode(meta))
    except (TypeError, ValueError, OverflowError) as exc:
        raise ValidationError(f"artifact meta is not JSON: {exc}", path="$.meta") from None
    return meta if size <= ARTIFACT_META_MAX_BYTES else UNSET


def normalize_artifact(artifact: SessionArtifact) -> SessionArtifact:
    """``artifact`` within the artifact limits: what every store keeps, on every write path.

    The bounds of :func:`normalize_artifact_input`, for a typed artifact: a
    kind over :data:`ARTIFACT_KIND_MAX_CHARS` or a uri over
    :data:`ARTIFACT_URI_MAX_CHARS` is refused (:class:`ValidationError`: an
    identity cannot be clipped) and a ``meta`` whose JSON is over
    :data:`ARTIFACT_META_MAX_BYTES` is dropped (the artifact is kept). The
    label is kept as given: the reference clips a producer's label
    (:func:`clip_artifact_label`, applied by ``Session.add_artifact``), never a
    stored one. Answers ``artifact`` itself when nothing changes.
    """
    if not isinstance(artifact, SessionArtifact):
        raise ValidationError(f"expected a SessionArtifact, got {type(artifact).__name__}")
    for name, value, limit in (
        ("kind", artifact.kind, ARTIFACT_KIND_MAX_CHARS),
        ("uri", artifact.uri, ARTIFACT_URI_MAX_CHARS),
    ):
        if isinstance(value, str) and len(value) > limit:
            raise ValidationError(
                f"artifact {name} is {len(value)} characters, over the {limit}-character limit",
                path=f"$.{name}",
            )
        check_column_text(value, what=f"artifact {name}", path=f"$.{name}")
    check_column_text(artifact.project_root, what="artifact project root", path="$.projectRoot")
    meta = _bounded_meta(artifact.meta)
    if meta is artifact.meta:
        return artifact
    return msgspec.structs.replace(artifact, meta=meta)


def check_artifact_id_free(artifact: SessionArtifact, holder: SessionArtifact | None) -> None:
    """Refuse an insert whose id another artifact of the session already holds.

    An upsert that finds no row for its ``(kind, uri)`` inserts a new row;
    ``holder`` is the session's artifact with the incoming id, if any. Taking
    over its id would replace (and so delete) that other artifact, so every
    store raises ``ConflictError`` instead, before evicting anything.
    """
    if holder is not None:
        raise ConflictError(
            f"artifact id {preview(artifact.id)} of session"
            f" {preview(artifact.session_id)} is held by"
            f" another artifact (kind {preview(holder.kind)},"
            f" uri {preview(holder.uri)}); an upsert of"
            f" kind {preview(artifact.kind)}, uri {preview(artifact.uri)} cannot reuse it"
        )


def merge_artifact(existing: SessionArtifact, incoming: SessionArtifact) -> SessionArtifact:
    """Apply an upsert to a stored row.

    Identity (``id``, ``runId``, ``turnId``, ``createdAt``) stays, ``label``
    refreshes, ``meta`` and ``projectRoot`` refresh when the incoming artifact
    has them, and ``updatedAt`` becomes the later of the two.
    """
    return msgspec.structs.replace(
        existing,
        label=incoming.label,
        meta=existing.meta if incoming.meta is UNSET else incoming.meta,
        project_root=(
            existing.project_root if incoming.project_root is None else incoming.project_root
        ),
        updated_at=max(existing.updated_at, incoming.updated_at),
    )


def select_artifact_evictions(
    current: Sequence[SessionArtifact], cap: int = ARTIFACTS_PER_SESSION_CAP
) -> list[str]:
    """Ids to evict so the session stays at or under ``cap`` after one more insert.

    ``file`` artifacts go first, oldest first within a kind; ties keep the
    caller's (insertion) order.
    """
    excess = len(current) + 1 - cap
    if excess <= 0:
        return []
    order = sorted(
        range(len(current)),
        key=lambda i: (current[i].kind != ARTIFACT_KINDS.file, current[i].created_at),
    )
    return [current[i].id for i in order[:excess]]


def sort_artifacts(artifacts: list[SessionArtifact]) -> list[SessionArtifact]:
    """Sort newest ``updatedAt`` first, stable on id; in place, and returned."""
    artifacts.sort(key=lambda a: a.id)
    artifacts.sort(key=lambda a: a.updated_at, reverse=True)
    return artifacts


def matches_artifact_filter(artifact: SessionArtifact, filter: ArtifactFilter | None) -> bool:
    """Whether ``artifact`` passes ``filter`` (``None`` matches all; ``limit`` not applied)."""
    if filter is None:
        return True
    if filter.session_id is not None and artifact.session_id != filter.session_id:
        return False
    if filter.kind is not None and artifact.kind != filter.kind:
        return False
    if filter.uri is not None and artifact.uri != filter.uri:
        return False
    if filter.since is not None and artifact.updated_at < filter.since:
        return False
    return filter.project_root is UNSET or artifact.project_root == filter.project_root


def filter_artifacts(
    artifacts: Iterable[SessionArtifact], filter: ArtifactFilter | None
) -> list[SessionArtifact]:
    """Matching artifacts, newest first, cut to ``filter.limit``."""
    rows = sort_artifacts([a for a in artifacts if matches_artifact_filter(a, filter)])
    if filter is not None and filter.limit is not None:
        del rows[filter.limit :]
    return rows
