"""Provider-native blocks for another provider: their text, or a reported drop."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any, Literal

import msgspec

from ..model import NativeBlock
from ._common import diagnosed
from ._json import json_text
from ._provider_data import ANTHROPIC, CHAT, RESPONSES

__all__ = [
    "CANONICAL",
    "ConvertContext",
    "DowngradeSink",
    "WireDowngrade",
    "WireDowngradeKind",
    "foreign_text",
    "native_text",
    "native_type",
]

WireDowngradeKind = Literal["converted", "dropped"]


class WireDowngrade(msgspec.Struct, frozen=True):
    """A block another provider's format could not take as it was.

    ``index`` is the message index (into the converter's input), ``path``
    the block inside it, ``kind`` whether it became text (``converted``) or
    was left out (``dropped``), ``block_type`` the native type.
    """

    index: int
    path: str
    kind: WireDowngradeKind
    block_type: str


DowngradeSink = Callable[[WireDowngrade], None]


def _str(value: object) -> str:
    return value if isinstance(value, str) else ""


def _texts(blocks: object) -> list[str]:
    if isinstance(blocks, str):
        return [blocks]
    if not isinstance(blocks, list):
        return []
    return [
        b["text"]
        for b in blocks
        if isinstance(b, Mapping) and b.get("type") == "text" and isinstance(b.get("text"), str)
    ]


def _error(label: str, content: Mapping[str, Any]) -> str:
    code = _str(content.get("error_code")) or "error"
    message = _str(content.get("error_message"))
    return f"{label} failed: {code}" + (f" ({message})" if message else "")


def _execution(label: str, content: Mapping[str, Any]) -> str:
    lines = [f"{label} (return code {content.get('return_code')})"]
    for key in ("stdout", "stderr"):
        text = _str(content.get(key))
        if text:
            lines.append(f"{key}:\n{text}")
    return "\n".join(lines)


def _anthropic_text(data: Mapping[str, Any], path: str) -> str | None:
    kind = data.get("type")
    content = data.get("content")
    if kind == "server_tool_use":
        arguments = json_text(
            data.get("input", {}), f"{path}.data.input", compact=False, sort_keys=True
        )
        return f"[{data.get('name')} {arguments}]"
    if kind == "web_search_tool_result":
        if isinstance(content, Mapping):
            return _error("Web search", content)
        lines = ["Web search results:"]
        for result in content if isinstance(content, list) else []:
            if isinstance(result, Mapping):
                lines.append(f"- {_str(result.get('title'))} ({_str(result.get('url'))})")
        return "\n".join(lines)
    if kind == "web_fetch_tool_result" and isinstance(content, Mapping):
        if content.get("type") != "web_fetch_result":
            return _error("Web fetch", content)
        document = content.get("content")
        body = ""
        if isinstance(document, Mapping):
            source = document.get("source")
            if isinstance(source, Mapping) and source.get("type") == "text":
                body = _str(source.get("data"))
            elif isinstance(source, Mapping) and source.get("type") == "content":
                body = "\n".join(_texts(source.get("content")))
        return f"Fetched {_str(content.get('url'))}" + (f":\n{body}" if body else "")
    if kind in (
        "code_execution_tool_result",
        "bash_code_execution_tool_result",
        "text_editor_code_execution_tool_result",
        "tool_search_tool_result",
    ) and isinstance(content, Mapping):
        result_type = _str(content.get("type"))
        if result_type.endswith("_error"):
            return _error(str(kind).removesuffix("_tool_result").replace("_", " "), content)
        if result_type in ("code_execution_result", "bash_code_execution_result"):
            return _execution("Code execution", content)
        if result_type == "encrypted_code_execution_result":
            return _execution("Code execution", {**content, "stdout": ""})
        if result_type == "text_editor_code_execution_view_result":
            return _str(content.get("content"))
        if result_type == "tool_search_tool_search_result":
            names = [
                _str(r.get("tool_name"))
                for r in content.get("tool_references") or []
                if isinstance(r, Mapping)
            ]
            return "Tools found: " + ", ".join(names)
        return f"[{result_type}]"
    if kind == "search_result":
        head = f"{_str(data.get('title'))} ({_str(data.get('source'))})"
        return "\n".join([head, *_texts(content)])
    if kind == "document":
        source = data.get("source")
        if isinstance(source, Mapping) and source.get("type") == "content":
            return "\n".join(_texts(source.get("content"))) or None
        return None
    if kind == "mcp_tool_use":
        arguments = json_text(
            data.get("input", {}), f"{path}.data.input", compact=False, sort_keys=True
        )
        server = _str(data.get("server_name"))
        return f"[{server + '.' if server else ''}{_str(data.get('name'))} {arguments}]"
    if kind == "mcp_tool_result":
        label = "MCP tool failed" if data.get("is_error") else "MCP tool result"
        body = "\n".join(_texts_any(content))
        return f"{label}:\n{body}" if body else f"{label}."
    if kind == "tool_reference":
        return f"Tool: {_str(data.get('tool_name'))}"
    if kind == "browser_state":
        tabs = [
            f"- {_str(t.get('title'))} ({_str(t.get('url'))})"
            for t in data.get("tabs") or []
            if isinstance(t, Mapping)
        ]
        return "\n".join(["Browser tabs:", *tabs])
    return None


def _chat_text(data: Mapping[str, Any]) -> str | None:
    call = data.get("function_call")
    if isinstance(call, Mapping):
        return f"[{_str(call.get('name'))} {_str(call.get('arguments'))}]"
    if data.get("role") == "function":
        return f"Result of {_str(data.get('name'))}:\n{_str(data.get('content'))}"
    return None


def _responses_text(data: Mapping[str, Any]) -> str | None:
    kind = data.get("type")
    if kind == "web_search_call":
        action = data.get("action")
        query = _str(action.get("query")) if isinstance(action, Mapping) else ""
        return f"[web search {query}]" if query else None
    if kind == "mcp_call":
        output = _str(data.get("output")) or _str(data.get("error"))
        return f"[{_str(data.get('name'))} {_str(data.get('arguments'))}]\n{output}".rstrip()
    if kind == "code_interpreter_call":
        logs = [
            _str(o.get("logs"))
            for o in data.get("outputs") or []
            if isinstance(o, Mapping) and o.get("type") == "logs"
        ]
        return "\n".join([f"Code:\n{_str(data.get('code'))}", *logs])
    if kind == "local_shell_call":
        action = data.get("action")
        command = action.get("command") if isinstance(action, Mapping) else None
        words = [w for w in command if isinstance(w, str)] if isinstance(command, list) else []
        return f"[local shell {' '.join(words)}]" if words else None
    if kind == "local_shell_call_output":
        output = _str(data.get("output"))
        return f"Local shell output:\n{output}" if output else None
    if kind == "file_search_call":
        queries = [q for q in data.get("queries") or [] if isinstance(q, str)]
        lines = [f"[file search {'; '.join(queries)}]"]
        for result in data.get("results") or []:
            if isinstance(result, Mapping):
                name = _str(result.get("filename")) or _str(result.get("file_id"))
                lines.append(f"- {name}: {_str(result.get('text'))}".rstrip(": "))
        return "\n".join(lines)
    if kind == "message":
        return "\n".join(_texts_any(data.get("content"))) or None
    return None


def _texts_any(content: object) -> list[str]:
    if isinstance(content, str):
        return [content]
    if not isinstance(content, list):
        return []
    out: list[str] = []
    for part in content:
        if not isinstance(part, Mapping):
            continue
        text = part.get("text", part.get("refusal"))
        if isinstance(text, str):
            out.append(text)
        elif isinstance(part.get("file_url"), str):  # a document by URL: readable anywhere
            out.append(f"[file {_str(part.get('filename'))} {part['file_url']}]".replace("  ", " "))
        elif isinstance(part.get("image_url"), str) and not part["image_url"].startswith("data:"):
            out.append(f"[image {part['image_url']}]")
    return out


@diagnosed("block", (NativeBlock,), one=True)
def native_text(block: NativeBlock, path: str = "$") -> str | None:
    """The text another provider gets for ``block``, or ``None`` when it is dropped.

    Server-tool calls and results, search results and similar blocks become
    their readable text; references only their own provider can resolve
    (file ids, audio ids, container uploads, encrypted items) are dropped.
    """
    if block.provider == ANTHROPIC:
        text = _anthropic_text(block.data, path)
    elif block.provider == CHAT:
        text = _chat_text(block.data)
    elif block.provider == RESPONSES:
        text = _responses_text(block.data)
    else:
        text = None
    return text if text and text.strip() else None


def native_type(block: NativeBlock) -> str:
    """A short name of the native block's kind (for reports)."""
    for key in ("type", "role"):
        value = block.data.get(key)
        if isinstance(value, str):
            return value
    return next(iter(block.data), "native")


class ConvertContext:
    """What converting one message needs: the tool-id map, its index, where to report."""

    def __init__(self, ids: Mapping[str, str], index: int, sink: DowngradeSink | None) -> None:
        self.ids = ids
        self.index = index
        self.sink = sink

    def report(self, path: str, kind: WireDowngradeKind, block_type: str) -> None:
        """Tell the sink (if any) about one downgrade."""
        if self.sink is not None:
            self.sink(WireDowngrade(self.index, path, kind, block_type))


CANONICAL = ConvertContext({}, 0, None)
"""The context of the canonical conversion a reader diffs against (no remap, no reports)."""


def foreign_text(block: NativeBlock, path: str, ctx: ConvertContext) -> str | None:
    """``block``'s text for another provider, or ``None``; either way reported to ``ctx``."""
    text = native_text(block, path)
    ctx.report(path, "dropped" if text is None else "converted", native_type(block))
    return text
