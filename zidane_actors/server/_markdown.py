"""Markdown in transcripts: CommonMark with tables, rendered safely for the browser.

Raw HTML is off (it shows as text), links go through the browser's safe-link
rule (absolute http(s) and mailto only; anything else stays text) and open in
a new tab without a referrer, and images become links: the page never loads
a remote resource.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Final

from markdown_it import MarkdownIt
from markdown_it.common.utils import escapeHtml
from markdown_it.token import Token

from ._html import Html, safe_link

__all__ = ["render_markdown"]

_LINK_ATTRS: Final = (("rel", "noopener noreferrer nofollow"), ("target", "_blank"))


def _link_open(renderer: Any, tokens: Sequence[Token], idx: int, options: Any, env: Any) -> str:
    for name, value in _LINK_ATTRS:
        tokens[idx].attrSet(name, value)
    rendered: str = renderer.renderToken(tokens, idx, options, env)
    return rendered


def _image(renderer: Any, tokens: Sequence[Token], idx: int, options: Any, env: Any) -> str:
    token = tokens[idx]
    alt = escapeHtml(token.content or "image")
    src = safe_link(str(token.attrGet("src") or ""))
    if src is None:
        return f"[image: {alt}]"
    rel, target = (value for _, value in _LINK_ATTRS)
    return f'<a href="{escapeHtml(src)}" rel="{rel}" target="{target}">image: {alt}</a>'


def _parser() -> MarkdownIt:
    md = MarkdownIt("commonmark", {"html": False, "linkify": False, "typographer": False})
    md.enable(["table", "strikethrough"])
    md.validateLink = lambda url: safe_link(url) is not None  # type: ignore[method-assign]
    md.add_render_rule("link_open", _link_open)
    md.add_render_rule("image", _image)
    return md


_MD: Final = _parser()


def render_markdown(text: str) -> Html:
    """``text`` as safe HTML (CommonMark, tables, strikethrough; no raw HTML)."""
    return Html(_MD.render(text))
