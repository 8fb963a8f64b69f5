"""Which reasoning blocks may be replayed to which provider."""

from __future__ import annotations

from typing import Literal

from ..model import ReasoningBlock
from ._common import diagnosed

__all__ = ["provider_family", "reasoning_wire_action"]


def provider_family(provider: str) -> str:
    """The converter family of a provider name (``anthropic``, ``openai`` or the name itself)."""
    name = provider.strip().lower()
    for family in ("anthropic", "openai"):
        if name == family or name.startswith((family + "-", family + ":", family + "/")):
            return family
    return name


@diagnosed("block", (ReasoningBlock,), one=True)
def reasoning_wire_action(
    block: ReasoningBlock, provider: str, *, store: bool = True
) -> Literal["keep", "drop"]:
    """Whether ``block`` is replayed to ``provider`` or dropped.

    Reasoning is only ever replayed to the provider that produced it, and
    only with the opaque payload that provider needs to accept it:
    Anthropic needs a thinking ``signature`` or ``redactedData``; OpenAI
    (Responses API) needs the item ``id`` (with its ``encrypted_content``,
    kept in ``signature``, or without it for an item the API stored: not
    when the request is sent with ``store=False``, which keeps no items).
    Anything else is dropped, never turned into text the model would read
    as its own words.
    """
    family = provider_family(provider)
    if block.provider is None or provider_family(block.provider) != family:
        return "drop"
    if family == "anthropic" and (block.signature or block.redacted_data):
        return "keep"
    if family == "openai" and block.id and (store or block.signature):
        return "keep"
    return "drop"
