"""Token usage and cost of model responses, shared by the integrations.

A response's cost is the caller's ``price(usage)`` when given, else
genai-prices' figure for the model when that package is installed and
knows the model (it comes with pydantic-ai), else unknown (``None``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TypeAlias

from ..model import TurnUsage

__all__ = ["Price", "cost_of", "total"]

Price: TypeAlias = Callable[[TurnUsage], "float | None"]
"""The cost in USD of one response's usage (``usage.model`` names the model), or ``None``."""


def cost_of(usage: TurnUsage, price: Price | None) -> float | None:
    """``usage``'s cost: ``price(usage)`` when given, else genai-prices' when it knows the model."""
    if price is not None:
        return price(usage)
    if usage.model is None:
        return None
    try:
        import genai_prices
    except ImportError:  # pragma: no cover - an optional extra
        return None
    measured = genai_prices.Usage(
        input_tokens=usage.input,
        output_tokens=usage.output,
        cache_read_tokens=usage.cache_read,
        cache_write_tokens=usage.cache_creation,
    )
    try:
        return float(genai_prices.calc_price(measured, model_ref=usage.model).total_price)
    except LookupError:
        return None


def total(usages: Sequence[TurnUsage]) -> TurnUsage:
    """The sum of ``usages`` (cost only when every one has a cost)."""
    cache_read = [u.cache_read for u in usages if u.cache_read is not None]
    cache_creation = [u.cache_creation for u in usages if u.cache_creation is not None]
    costs = [u.cost for u in usages]
    return TurnUsage(
        input=sum(u.input for u in usages),
        output=sum(u.output for u in usages),
        cache_read=sum(cache_read) if cache_read else None,
        cache_creation=sum(cache_creation) if cache_creation else None,
        cost=sum(c for c in costs if c is not None) if costs and None not in costs else None,
    )
