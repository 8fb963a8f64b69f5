"""Escape-by-construction HTML for the session browser.

Every ``str`` that reaches :func:`el` (as a child or an attribute value) is
escaped; only :class:`Html` values, which this module alone builds, pass
through as markup. Store content (turn text, titles, ids, URIs) is
therefore inert wherever it lands. URLs for ``href``/``src`` go through
:func:`safe_link` / :func:`safe_image_src`, which allow only harmless
schemes.
"""

from __future__ import annotations

import html
import re
from collections.abc import Iterable, Mapping
from typing import Final, TypeAlias
from urllib.parse import quote, urlsplit

__all__ = ["Html", "Node", "el", "safe_image_src", "safe_link", "ui_path"]


class Html(str):
    """Markup that is already safe (built by :func:`el` or :func:`join`)."""

    __slots__ = ()


Node: TypeAlias = "Html | str | int | float | Iterable[Node] | None"
AttrValue: TypeAlias = str | int | float | bool | None

_TAG: Final = re.compile(r"^[a-z][a-z0-9]*$")
_ATTR: Final = re.compile(r"^[a-zA-Z][a-zA-Z0-9-]*$")
_VOID: Final = frozenset({"br", "hr", "img", "input", "meta", "link", "col"})
_LINK_SCHEMES: Final = frozenset({"http", "https", "mailto"})
_IMAGE_TYPES: Final = frozenset({"image/png", "image/jpeg", "image/gif", "image/webp"})
_BASE64: Final = re.compile(r"^[A-Za-z0-9+/\s]*={0,2}\s*$")
_DATA_URL: Final = re.compile(r"^data:([a-z0-9.+/-]+);base64,(.*)$", re.IGNORECASE | re.DOTALL)


def _render(node: Node, out: list[str]) -> None:
    if node is None or node is False:
        return
    if isinstance(node, Html):
        out.append(node)
    elif isinstance(node, str):
        out.append(html.escape(node, quote=True))
    elif isinstance(node, int | float):
        out.append(html.escape(str(node)))
    else:
        for child in node:
            _render(child, out)


def el(tag: str, attrs: Mapping[str, AttrValue] | None = None, *children: Node) -> Html:
    """``<tag attrs>children</tag>``; attribute values and text children escaped.

    ``True`` writes a bare attribute, ``None``/``False`` omits it. Tag and
    attribute names are the caller's literals and must be plain names.
    """
    if not _TAG.match(tag):
        raise ValueError(f"bad tag name {tag!r}")
    parts = [f"<{tag}"]
    for name, value in (attrs or {}).items():
        if not _ATTR.match(name):
            raise ValueError(f"bad attribute name {name!r}")
        if value is None or value is False:
            continue
        if value is True:
            parts.append(f" {name}")
        else:
            parts.append(f' {name}="{html.escape(str(value), quote=True)}"')
    parts.append(">")
    if tag in _VOID:
        return Html("".join(parts))
    out: list[str] = []
    _render(children, out)
    return Html("".join(parts) + "".join(out) + f"</{tag}>")


def safe_link(uri: str) -> str | None:
    """``uri`` when it is an absolute http(s)/mailto URL, else ``None`` (show it as text)."""
    try:
        parts = urlsplit(uri.strip())
    except ValueError:
        return None
    if parts.scheme.lower() not in _LINK_SCHEMES:
        return None
    if parts.scheme.lower() != "mailto" and not parts.netloc:
        return None
    if any(ord(c) < 0x20 or c.isspace() for c in uri.strip()):
        return None
    return uri.strip()


def safe_image_src(media_type: str | None, data: str | None, url: str | None) -> str | None:
    """A ``data:`` URL for an inline raster image (png, jpeg, gif, webp), else ``None``.

    Remote image URLs are never loaded (the page's CSP allows only
    ``data:`` and same-origin images): the caller shows them as links.
    SVG is refused: it is a document, not a picture.
    """
    if data is not None:
        kind = (media_type or "").lower()
        if kind in _IMAGE_TYPES and _BASE64.match(data):
            return f"data:{kind};base64,{''.join(data.split())}"
        return None
    if url is not None:
        match = _DATA_URL.match(url.strip())
        if match and match[1].lower() in _IMAGE_TYPES and _BASE64.match(match[2]):
            return f"data:{match[1].lower()};base64,{''.join(match[2].split())}"
    return None


def ui_path(*segments: str) -> str:
    """A path under ``/ui/`` with each segment percent-encoded."""
    return "/ui/" + "/".join(quote(s, safe="") for s in segments)


def ui_fragment_path(*segments: str) -> str:
    """A path under ``/ui/fragments/`` with each segment percent-encoded."""
    return "/ui/fragments/" + "/".join(quote(s, safe="") for s in segments)
