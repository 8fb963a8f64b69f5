"""Layer 2: provider wire formats ↔ neutral messages, and the tool-pairing repairs.

Pure functions: they never mutate their inputs and are idempotent where it
makes sense. Bad wire input raises :class:`~zidane_actors.errors.WireFormatError`
with a JSONPath-like location.
"""

from ._anthropic import (
    ANTHROPIC_IMAGE_MEDIA_TYPES,
    REFUSAL_FALLBACK_TEXT,
    anthropic_tool_id_map,
    from_anthropic,
    from_anthropic_request,
    to_anthropic,
    to_anthropic_request,
)
from ._common import RAW_ARGUMENTS_KEY
from ._detect import auto_detect_and_convert
from ._downgrade import DowngradeSink, WireDowngrade, WireDowngradeKind, native_text
from ._openai_chat import from_openai, from_openai_request, to_openai, to_openai_request
from ._openai_common import OPENAI_TOOL_ID_MAX_LENGTH, openai_tool_id_map
from ._openai_responses import from_openai_responses, to_openai_responses
from ._pairing import (
    SYNTHETIC_TOOL_RESULT_PLACEHOLDER,
    PairingDrop,
    PairingDropKind,
    PairingRepair,
    PairingRepairKind,
    drop_invalid_tool_pairings,
    ensure_tool_result_pairing,
    interrupted_tool_result_output,
    orphaned_tool_result_marker,
)
from ._pipeline import (
    DEFAULT_USER_TAIL_DIRECTIVE,
    ResolveContentRef,
    ensure_ends_with_user_message,
    to_wire_messages,
)
from ._reasoning import reasoning_wire_action

__all__ = [
    "ANTHROPIC_IMAGE_MEDIA_TYPES",
    "DEFAULT_USER_TAIL_DIRECTIVE",
    "OPENAI_TOOL_ID_MAX_LENGTH",
    "RAW_ARGUMENTS_KEY",
    "REFUSAL_FALLBACK_TEXT",
    "SYNTHETIC_TOOL_RESULT_PLACEHOLDER",
    "DowngradeSink",
    "PairingDrop",
    "PairingDropKind",
    "PairingRepair",
    "PairingRepairKind",
    "ResolveContentRef",
    "WireDowngrade",
    "WireDowngradeKind",
    "anthropic_tool_id_map",
    "auto_detect_and_convert",
    "drop_invalid_tool_pairings",
    "ensure_ends_with_user_message",
    "ensure_tool_result_pairing",
    "from_anthropic",
    "from_anthropic_request",
    "from_openai",
    "from_openai_request",
    "from_openai_responses",
    "interrupted_tool_result_output",
    "native_text",
    "openai_tool_id_map",
    "orphaned_tool_result_marker",
    "reasoning_wire_action",
    "to_anthropic",
    "to_anthropic_request",
    "to_openai",
    "to_openai_request",
    "to_openai_responses",
    "to_wire_messages",
]
