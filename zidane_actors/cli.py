"""``zidane-actors``: serve a store over REST, inspect, export, import, heal and copy sessions.

Exit codes: 0 ok, 1 runtime error, 2 usage error. Expected failures print
one line on stderr, never a traceback; a usage error prints the usage too. A
reader that stops early (``| head``) ends the output quietly, exit code 0; a
command that writes to a store still makes every write (its report is what
stops) and exits 0 only if everything was written.
What argparse prints is plain text: no reST markup in help strings.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import signal
import sys
from collections.abc import Awaitable, Callable, Sequence
from datetime import UTC, datetime
from typing import Any, Final, NoReturn, Protocol, TextIO

import attrs
import msgspec
import trio

from . import __version__
from . import _transfer as transfer
from .errors import SessionNotFoundError, StoreError, ValidationError, ZidaneActorsError
from .model import (
    SessionContentBlock,
    SessionData,
    SessionHistory,
    SessionRun,
    SessionTurn,
    TextBlock,
    ToolCallBlock,
    ToolResultBlock,
    call_input,
    to_builtins,
    validate_id,
)
from .stores import SessionStore, store_capabilities
from .stores._url import TOKEN_ENV, open_store_url

__all__ = ["main"]

DEFAULT_STORE: Final = "sqlite:./zidane-sessions.db"
DEFAULT_HOST: Final = "127.0.0.1"
DEFAULT_PORT: Final = 8787
FAULTS_ENV: Final = "ZIDANE_ACTORS_FAULTS"
_PREVIEW: Final = 400


class _UsageError(Exception):
    """A command line that parses but makes no sense (exit code 2)."""


class _Parser(argparse.ArgumentParser):
    """Raises on a usage error instead of ``sys.exit``: ``main`` prints it and answers 2."""

    def error(self, message: str) -> NoReturn:
        # What argparse and POSIX tools print for a usage error: the usage, then the error.
        raise _UsageError(
            f"{self.format_usage()}{self.prog}: error: {message}\n"
            f"Run '{self.prog} --help' for more information."
        )


class _Out(Protocol):
    """Where a command prints (``print(file=…)``)."""

    def write(self, text: str, /) -> int: ...

    def flush(self) -> None: ...


class _Report:
    """A write command's report: a stream that fails never stops the writes it reports.

    The first failure is kept and every later line dropped (stdout is pointed
    at ``/dev/null``, so the flush at exit does not fail again). A reader gone
    (``| head``, EPIPE) is what Unix tools ignore; any other failure is raised
    by :meth:`raise_failure` once every write to the store was made.
    """

    def __init__(self, stream: _Out) -> None:
        self.stream = stream
        self.failure: OSError | None = None

    def write(self, text: str, /) -> int:
        if self.failure is None:
            try:
                self.stream.write(text)
            except OSError as exc:
                self._failed(exc)
        return len(text)

    def flush(self) -> None:
        if self.failure is None:
            try:
                self.stream.flush()
            except OSError as exc:
                self._failed(exc)

    def _failed(self, exc: OSError) -> None:
        self.failure = exc
        if self.stream is sys.stdout:
            _stdout_to_devnull()

    def raise_failure(self) -> None:
        """Raise the report's failure, unless there was none or its reader left."""
        if self.failure is not None and not isinstance(self.failure, BrokenPipeError):
            raise OSError(
                self.failure.errno,
                f"the report could not be written ({self.failure.strerror or self.failure});"
                " every write to the store was made",
            )


# -- serve --------------------------------------------------------------


def _serve_token(args: argparse.Namespace, err: TextIO) -> str | None:
    """The token from ``--token-file``, ``--token`` (warned: visible in ``ps``) or the env."""
    if args.token is not None and args.token_file is not None:
        raise ValidationError("give --token or --token-file, not both")
    if args.token_file is not None:
        with open(args.token_file, encoding="utf-8") as file:
            token = file.read().strip()
        if not token:
            raise ValidationError(f"token file {args.token_file!r} is empty")
        return token
    if args.token is not None:
        print(
            f"zidane-actors: warning: --token is visible to every local user (ps); "
            f"prefer {TOKEN_ENV} or --token-file",
            file=err,
            flush=True,
        )
        return args.token or None
    return os.environ.get(TOKEN_ENV) or None


async def _serve(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    from .server import ServerLimits, parse_faults, serve

    token = _serve_token(args, err)
    given = {
        "max_body_bytes": args.max_body_bytes,
        "max_body_bytes_in_flight": args.max_body_bytes_in_flight,
        "max_requests": args.max_requests,
        "body_timeout_s": args.body_timeout,
    }
    limits = ServerLimits(**{k: v for k, v in given.items() if v is not None})
    faults_spec = os.environ.get(FAULTS_ENV)
    faults = parse_faults(faults_spec) if faults_spec else None
    # Signals are caught before the URL is printed: a SIGTERM right after it stops cleanly.
    with trio.open_signal_receiver(signal.SIGINT, signal.SIGTERM) as signals:
        async with open_store_url(args.store) as store, trio.open_nursery() as nursery:
            url = await nursery.start(
                lambda task_status: serve(
                    store,
                    args.host,
                    args.port,
                    token=token,
                    limits=limits,
                    faults=faults,
                    task_status=task_status,
                )
            )
            print(f"listening on {url}", file=out, flush=True)
            print(f"session browser: {url}/ui/", file=out, flush=True)
            async for _ in signals:
                break
            nursery.cancel_scope.cancel()
    return 0


# -- sessions -----------------------------------------------------------


def _when(ms: int | None) -> str:
    if ms is None:
        return "-"
    return datetime.fromtimestamp(ms / 1000, UTC).strftime("%Y-%m-%d %H:%M:%S")


def _title(metadata: dict[str, Any], first_user: SessionTurn | None) -> str:
    title = metadata.get("title")
    if isinstance(title, str) and title:
        return title
    if first_user is not None:
        text = " ".join(b.text for b in first_user.content if isinstance(b, TextBlock))
        return text.replace("\n", " ")[:60]
    return ""


async def _list(store: SessionStore, args: argparse.Namespace, out: _Out) -> int:
    from .model import SessionFilter, is_scope_session_id, shown_session_status
    from .stores._validate import now_ms

    now = now_ms()

    def listed(sid: str) -> bool:
        return args.scopes or not is_scope_session_id(sid)

    lines: list[tuple[str, str, int, str, str]] = []
    if "list_meta" in store_capabilities(store):
        asked = args.limit
        while True:  # scope sessions left out: ask for more until the limit is met
            rows = await store.list_meta(SessionFilter(agent_id=args.agent, limit=asked))  # type: ignore[attr-defined]
            kept = [r for r in rows if listed(r.id)][: args.limit]
            if asked is None or len(rows) < asked or len(kept) >= args.limit:
                break
            asked *= 2
        lines = [
            (
                r.id,
                shown_session_status(r.status, r.run_owner, r.updated_at, now),
                r.turn_count,
                _when(r.updated_at),
                _title(r.metadata, r.first_user_turn),
            )
            for r in kept
        ]
    else:
        ids = [sid for sid in await store.list(SessionFilter(agent_id=args.agent)) if listed(sid)]
        for sid in ids[: args.limit]:
            data = await store.load(sid)
            if data is None:
                continue
            first = next((t for t in data.turns if t.role == "user"), None)
            lines.append(
                (
                    sid,
                    shown_session_status(data.status, data.run_owner, data.updated_at, now),
                    len(data.turns),
                    _when(data.updated_at),
                    _title(data.metadata, first),
                )
            )
    if not lines:
        print("no sessions", file=out)
        return 0
    width = max(len(line[0]) for line in lines)
    print(f"{'ID':<{width}}  {'STATUS':<9}  {'TURNS':>5}  {'UPDATED (UTC)':<19}  TITLE", file=out)
    for sid, status, turns, updated, title in lines:
        print(f"{sid:<{width}}  {status:<9}  {turns:>5}  {updated:<19}  {title}", file=out)
    return 0


async def _load(store: SessionStore, session_id: str) -> SessionData:
    data = await store.load(validate_id(session_id))
    if data is None:
        raise SessionNotFoundError(f"no session {session_id!r} in the store")
    return data


def _clip(text: str) -> str:
    text = text.rstrip()
    return text if len(text) <= _PREVIEW else text[:_PREVIEW] + f"… ({len(text)} chars)"


def _indent(text: str, prefix: str) -> str:
    return "\n".join(prefix + line for line in text.splitlines() or [""])


def _result_text(block: ToolResultBlock) -> str:
    if isinstance(block.output, str):
        return block.output
    parts = []
    for part in block.output:
        kind = type(part).__name__.removesuffix("Block").lower()  # image, file, native
        parts.append(part.text if isinstance(part, TextBlock) else f"[{kind}]")
    return "\n".join(parts)


def _block_lines(
    block: SessionContentBlock, results: dict[str, ToolResultBlock], shown: set[str]
) -> list[str]:
    if isinstance(block, TextBlock):
        return [_indent(_clip(block.text), "    ")]
    if isinstance(block, ToolCallBlock):
        lines = [
            f"    → tool call {block.name} {json.dumps(call_input(block))[:200]}  (id {block.id})"
        ]
        result = results.get(block.id)
        if result is None:
            lines.append("      ← (no result)")
        else:
            shown.add(block.id)
            flag = " [error]" if result.is_error else ""
            lines.append(f"      ← result{flag}:")
            lines.append(_indent(_clip(_result_text(result)), "        "))
        return lines
    if isinstance(block, ToolResultBlock):
        if block.call_id in shown:
            return []
        return [
            f"    ← result for unknown call {block.call_id}:",
            _indent(_clip(_result_text(block)), "        "),
        ]
    kind = type(block).__name__.removesuffix("Block").lower()
    text = getattr(block, "text", "") or ""
    return [f"    [{kind}] {_clip(text)}" if text else f"    [{kind}]"]


def _run_tree(runs: Sequence[SessionRun]) -> list[str]:
    ids = {r.id for r in runs}
    children: dict[str | None, list[SessionRun]] = {}
    for run in runs:
        parent = run.parent_run_id if run.parent_run_id in ids else None
        children.setdefault(parent, []).append(run)
    lines: list[str] = []

    def walk(parent: str | None, depth: int, seen: set[str]) -> None:
        for run in children.get(parent, []):
            if run.id in seen:
                continue
            seen.add(run.id)
            prompt = run.prompt.replace("\n", " ")[:60]
            label = f" {run.label}" if run.label else ""
            lines.append(f"  {'  ' * depth}- {run.id} [{run.status}]{label} {prompt!r}")
            walk(run.id, depth + 1, seen)

    walk(None, 0, set())
    return lines


def _transcript(data: SessionData) -> str:
    lines = [
        f"session {data.id}",
        f"  status {data.status}, created {_when(data.created_at)},"
        f" updated {_when(data.updated_at)} (UTC)",
    ]
    if data.agent_id:
        lines.append(f"  agent {data.agent_id}")
    if data.project_root:
        lines.append(f"  project {data.project_root}")
    for key, value in sorted(data.metadata.items()):
        lines.append(f"  {key}: {json.dumps(value)[:120]}")
    if data.runs:
        lines.append("runs:")
        lines.extend(_run_tree(data.runs))
    results = {
        b.call_id: b for t in data.turns for b in t.content if isinstance(b, ToolResultBlock)
    }
    shown: set[str] = set()
    lines.append(f"turns ({len(data.turns)}):")
    for n, turn in enumerate(data.turns, 1):
        run = f", run {turn.run_id}" if turn.run_id else ""
        body = [line for b in turn.content for line in _block_lines(b, results, shown)]
        if not body and turn.content:
            continue  # tool results already shown under their calls
        lines.append(f"[{n}] {turn.role} ({_when(turn.created_at)}{run})")
        lines.extend(body)
    return "\n".join(lines)


async def _show(store: SessionStore, args: argparse.Namespace, out: _Out) -> int:
    print(_transcript(await _load(store, args.id)), file=out)
    return 0


async def _export(store: SessionStore, args: argparse.Namespace, out: _Out) -> int:
    if args.format == "jsonl":
        if args.id is None:  # the whole store: every session, then the schedules
            async for _, _, bundle in transfer.iterate_bundles(store):
                for line in transfer.bundle_lines(bundle):
                    print(line, file=out)
            for schedule, fires in await transfer.schedules_of(store):
                for line in transfer.schedule_lines(schedule, fires):
                    print(line, file=out)
            return 0
        found = await transfer.read_bundle(store, validate_id(args.id))
        if found is None:
            raise SessionNotFoundError(f"no session {args.id!r} in the store")
        for line in transfer.bundle_lines(found):
            print(line, file=out)
        return 0
    if args.id is None:
        raise ValidationError("a provider format exports one session: give its id")
    data = await _load(store, args.id)
    from . import wire

    messages = await wire.to_wire_messages(data.turns)
    request: object
    if args.format == "anthropic":
        request = wire.to_anthropic_request(messages)
    else:
        request = {"messages": wire.to_openai_request(messages)}
    print(json.dumps(to_builtins(request), indent=2, ensure_ascii=False), file=out)
    return 0


def _held(bundle: transfer.Bundle) -> str:
    """``4 turns, 2 runs, 1 artifacts``: what a session bundle holds."""
    data = bundle.data
    extra = "".join(
        f", {n} {kind}"
        for n, kind in (
            (len(bundle.artifacts), "artifacts"),
            (len(bundle.send_requests), "send requests"),
        )
        if n
    )
    return f"{len(data.turns)} turns, {len(data.runs)} runs{extra}"


@attrs.define
class _Outcome:
    """What a write command did, item by item (a session or a schedule)."""

    verb: str
    done: list[str] = attrs.field(factory=list)
    failed: list[tuple[str, BaseException]] = attrs.field(factory=list)

    async def put(
        self,
        what: str,
        write: Awaitable[None],
        out: _Out,
        summary: str,
        before: Callable[[], None] | None = None,
    ) -> bool:
        """Await ``write`` (all-or-nothing) and print its line; a failure is kept, not raised.

        A failure that could not be undone (:class:`transfer.PartialWriteError`) stops here.
        """
        try:
            await write
        except transfer.PartialWriteError as exc:
            raise transfer.PartialWriteError(
                f"{exc}; stopped there: nothing after it was {self.verb}"
            ) from exc
        except (ZidaneActorsError, OSError) as exc:
            self.failed.append((what, exc))
            if before is not None:
                before()
            print(f"not {self.verb} {what}: {exc} (nothing of it written)", file=out, flush=True)
            return False
        self.done.append(what)
        if before is not None:
            before()
        print(f"{self.verb} {what} ({summary})", file=out, flush=True)
        return True

    def check(self) -> None:
        """Raise, in one line, when an item failed (every other one was written whole)."""
        if not self.failed:
            return
        total = len(self.done) + len(self.failed)
        what, first = self.failed[0]
        more = f" (and {len(self.failed) - 1} more)" if len(self.failed) > 1 else ""
        raise StoreError(
            f"{len(self.failed)} of {total} not {self.verb} (nothing of them written):"
            f" {what}{more}: {first}"
        )


async def _import(store: SessionStore, args: argparse.Namespace, out: _Out) -> int:
    reader = transfer.JsonlReader(args.file)
    reader.read()
    writer = await transfer.Writer.open(store, replace=args.replace, where="store")
    await writer.check(
        [bundle.data.id for bundle in reader.bundles],
        artifacts=sum(len(bundle.artifacts) for bundle in reader.bundles),
        send_requests=sum(len(bundle.send_requests) for bundle in reader.bundles),
        schedules=[schedule for schedule, _ in reader.schedules],
        fires=sum(len(fires) for _, fires in reader.schedules),
    )
    outcome = _Outcome("imported")
    for bundle in reader.bundles:
        await outcome.put(bundle.data.id, writer.put(bundle), out, _held(bundle))
    for schedule, fires in reader.schedules:
        write = writer.put_schedule(schedule, fires)
        await outcome.put(f"schedule {schedule.id}", write, out, f"{len(fires)} fires")
    outcome.check()
    return 0


async def _heal(store: SessionStore, args: argparse.Namespace, out: _Out) -> int:
    from . import wire

    data = await _load(store, args.id)
    drops: list[wire.PairingDrop] = []
    healed = wire.drop_invalid_tool_pairings(data.turns, on_drop=drops.append)
    if not drops:
        print(f"{data.id}: nothing to heal", file=out)
        return 0
    if "mutate_history" in store_capabilities(store):
        # Heal what is stored at write time: turns appended meanwhile are kept.
        def mutate(history: SessionHistory) -> SessionHistory | None:
            again = wire.drop_invalid_tool_pairings(history.turns)
            if again is history.turns:
                return None
            return SessionHistory(turns=tuple(again), runs=history.runs)

        await store.mutate_history(data.id, mutate)  # type: ignore[attr-defined]
    else:
        await store.save(msgspec.structs.replace(data, turns=tuple(healed)))
    for drop in drops:
        where = f"turn {data.turns[drop.index].id} (#{drop.index + 1})"
        call = f" call {drop.call_id}" if drop.call_id else ""
        print(f"dropped {drop.kind}{call} in {where}", file=out)
    print(f"{data.id}: {len(drops)} drop(s) persisted", file=out)
    return 0


async def _rm(store: SessionStore, args: argparse.Namespace, out: _Out) -> int:
    await _load(store, args.id)
    await store.delete(args.id)
    print(f"deleted {args.id}", file=out)
    return 0


@attrs.define
class _Progress:
    """The progress line on stderr, redrawn in place (``\\r``): for a terminal only."""

    err: _Out
    total: int
    width: int = 30
    drawn: int = 0

    def draw(self, done: int) -> None:
        filled = self.width * done // self.total if self.total else self.width
        bar = "#" * filled + "-" * (self.width - filled)
        line = f"\rcopying [{bar}] {done}/{self.total} sessions"
        self.drawn = len(line) - 1
        print(line, end="", file=self.err, flush=True)

    def clear(self) -> None:
        """Wipe the line, so a line printed next starts at the margin."""
        print("\r" + " " * self.drawn + "\r", end="", file=self.err, flush=True)

    def end(self) -> None:
        print(file=self.err, flush=True)  # end the progress line (before an error line too)


async def _copy(args: argparse.Namespace, out: _Out, err: TextIO) -> int:
    # Progress only on a terminal: redrawn frames would fill a log file or a pipe.
    show = err.isatty()
    async with open_store_url(args.source) as source, open_store_url(args.target) as target:
        caps = await transfer.capabilities(source)
        writer = await transfer.Writer.open(target, replace=args.replace, where="target store")
        ids = await source.list()
        schedules = await transfer.schedules_of(source, caps)
        artifacts = 0
        if "list_artifacts" in caps:
            artifacts = len(await source.list_artifacts())  # type: ignore[attr-defined]
        # Refused before anything is written: what the target cannot hold, an id it holds.
        await writer.check(
            ids,
            artifacts=artifacts,
            send_requests=0,  # counted per session (no store lists them all): refused there
            schedules=[schedule for schedule, _ in schedules],
            fires=sum(len(fires) for _, fires in schedules),
        )
        read = transfer.Counts()
        left: dict[str, bytes] = {}
        outcome = _Outcome("copied")
        progress = _Progress(_Report(err), len(ids)) if show else None
        clear = progress.clear if progress is not None else None
        if progress is not None:
            progress.draw(0)
        try:
            for n, sid in enumerate(ids, 1):
                bundle = await transfer.read_bundle(source, sid, caps)
                if bundle is not None:  # None: deleted from the source meanwhile
                    read.add_bundle(bundle)
                    if await outcome.put(sid, writer.put(bundle), out, _held(bundle), clear):
                        left[sid] = bundle.encoded()
                if progress is not None:
                    progress.draw(n)
            for schedule, fires in schedules:
                read.add_schedule(len(fires))
                write = writer.put_schedule(schedule, fires)
                await outcome.put(
                    f"schedule {schedule.id}", write, out, f"{len(fires)} fires", clear
                )
        finally:
            if progress is not None:
                progress.end()
        arrived, stored = await transfer.stored_counts(target, writer.caps)
    copied = len(left)
    of = f"{copied} of {read.values['sessions']}" if copied != read.values["sessions"] else copied
    print(f"copied {of} session(s) from {args.source} to {args.target}", file=out)
    print(f"{'':14}{'source':>10}{'target':>10}", file=out)
    for kind in transfer.KINDS:
        print(f"{kind:14}{read.values[kind]:>10}{arrived.values[kind]:>10}", file=out)
    differ = sorted(sid for sid, data in left.items() if stored.get(sid) != data)
    if differ:
        more = f" (and {len(differ) - 1} more)" if len(differ) > 1 else ""
        raise StoreError(f"session {differ[0]!r} reads back different in the target{more}")
    print(f"verified: every copied session reads back byte for byte ({copied})", file=out)
    outcome.check()
    return 0


_SESSION_COMMANDS: Final = {
    "list": _list,
    "show": _show,
    "export": _export,
    "import": _import,
    "heal": _heal,
    "rm": _rm,
}


_WRITE_COMMANDS: Final = frozenset({"import", "heal", "rm"})
"""Session commands that write to the store (``copy`` too): their report never stops them."""


async def _run(args: argparse.Namespace, out: TextIO, err: TextIO) -> int:
    if args.command == "serve":
        return await _serve(args, out, err)
    if args.command == "copy" or args.action in _WRITE_COMMANDS:
        # A write finishes even when its reader goes away (| head): its report is what stops.
        report = _Report(out)
        if args.command == "copy":
            code = await _copy(args, report, err)
        else:
            async with open_store_url(args.store) as store:
                code = await _SESSION_COMMANDS[args.action](store, args, report)
        report.raise_failure()
        return code
    async with open_store_url(args.store) as store:
        return await _SESSION_COMMANDS[args.action](store, args, out)


_DESCRIPTION: Final = (
    "Serve a store over REST, inspect, export, import, heal and copy sessions."
    " Exit codes: 0 ok, 1 runtime error, 2 usage error."
)


def _parser() -> _Parser:
    """The command line; every text here is printed as is (plain text, no reST markup)."""
    parser = _Parser(
        prog="zidane-actors",
        description=_DESCRIPTION,
        epilog="Run 'zidane-actors COMMAND --help' for a command's options.",
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {__version__}")
    commands = parser.add_subparsers(dest="command", required=True, parser_class=_Parser)

    def command(
        group: argparse._SubParsersAction[_Parser],
        name: str,
        help: str,
        description: str | None = None,
    ) -> _Parser:
        # help is the line in the parent's list; description heads the command's own --help.
        return group.add_parser(
            name, help=help, description=description or help[0].upper() + help[1:] + "."
        )

    def store_option(p: argparse.ArgumentParser) -> None:
        p.add_argument(
            "--store", default=DEFAULT_STORE, help=f"store URL (default {DEFAULT_STORE})"
        )

    serve = command(
        commands,
        "serve",
        "serve a store over the REST session API",
        "Serve a store over the REST session API. The same server has a read-only session"
        f" browser at /ui/: http://{DEFAULT_HOST}:{DEFAULT_PORT}/ui/ with the default --host"
        " and --port (the URL is printed once the server listens).",
    )
    store_option(serve)
    serve.add_argument(
        "--host",
        default=DEFAULT_HOST,
        help=f"address to bind (default {DEFAULT_HOST}: local only)",
    )
    serve.add_argument(
        "--port",
        type=int,
        default=DEFAULT_PORT,
        help=f"TCP port (default {DEFAULT_PORT}; 0 picks a free one)",
    )
    serve.add_argument(
        "--token",
        help=f"bearer token required from clients (visible in ps: prefer env {TOKEN_ENV})",
    )
    serve.add_argument("--token-file", help="read the bearer token from this file")
    serve.add_argument("--max-body-bytes", type=int, help="largest request body (32 MiB)")
    serve.add_argument(
        "--max-body-bytes-in-flight", type=int, help="bytes of all bodies held at once (128 MiB)"
    )
    serve.add_argument("--max-requests", type=int, help="requests served at once (256)")
    serve.add_argument(
        "--body-timeout", type=float, help="seconds for a request body to arrive (30)"
    )

    sessions = command(commands, "sessions", "inspect and edit stored sessions")
    actions = sessions.add_subparsers(dest="action", required=True, parser_class=_Parser)
    listing = command(actions, "list", "list sessions, most recent first")
    store_option(listing)
    listing.add_argument("--agent", help="only sessions of this agent id")
    listing.add_argument("--limit", type=int, help="at most this many sessions")
    listing.add_argument(
        "--scopes",
        action="store_true",
        help="also list frameworks' internal scope sessions (google-adk app:/user: state)",
    )
    for name, text in (
        ("show", "print a readable transcript"),
        ("heal", "drop invalid tool pairings"),
        ("rm", "delete a session"),
    ):
        p = command(actions, name, text)
        store_option(p)
        p.add_argument("id", help="session id")
    export = command(
        actions,
        "export",
        "print a session (or every one, with schedules) as JSONL or provider messages",
    )
    store_option(export)
    export.add_argument("id", nargs="?", help="session id (default: the whole store, as JSONL)")
    export.add_argument(
        "--format",
        choices=("jsonl", "anthropic", "openai"),
        default="jsonl",
        help="jsonl (zidane documents, re-importable; default) or a provider's request",
    )
    imp = command(actions, "import", "import sessions from a JSONL export")
    store_option(imp)
    imp.add_argument("file", help="a JSONL file written by export")
    imp.add_argument(
        "--replace",
        action="store_true",
        help="replace, whole, the sessions and schedules the store holds already",
    )

    copy = command(
        commands,
        "copy",
        "copy everything between two stores (sessions, artifacts, send ids, schedules)",
        "Copy everything between two stores (sessions, artifacts, send ids, schedules), then"
        " check the target reads back the same. Progress is drawn on stderr when it is a"
        " terminal.",
    )
    copy.add_argument("--from", dest="source", required=True, help="source store URL")
    copy.add_argument("--to", dest="target", required=True, help="target store URL")
    copy.add_argument(
        "--replace",
        action="store_true",
        help="replace, whole, the sessions and schedules the target holds already",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run the command line; answers the exit code."""
    parser = _parser()
    try:
        args = parser.parse_args(argv)
        for name in ("port", "limit", "max_body_bytes"):
            value = getattr(args, name, None)
            if value is not None and value < 0:
                raise _UsageError(f"zidane-actors: --{name.replace('_', '-')} must be >= 0")
        if getattr(args, "port", None) is not None and args.port > 65535:
            raise _UsageError("zidane-actors: --port must be a TCP port (0 to 65535)")
    except _UsageError as exc:
        print(exc, file=sys.stderr)
        return 2
    except SystemExit as exc:  # --help
        return exc.code if isinstance(exc.code, int) else 0
    for stream in (sys.stdout, sys.stderr):
        # Stored text may hold a lone surrogate (JSON keeps it as an escape): printed as
        # that escape, so a listing, a transcript or a JSON export never fails on it.
        if isinstance(stream, io.TextIOWrapper):
            stream.reconfigure(errors="backslashreplace")
    try:
        code = trio.run(_run, args, sys.stdout, sys.stderr)
    except KeyboardInterrupt:
        return 130
    except BaseException as exc:
        if _reader_gone(exc):
            # The reader stopped early (| head): end quietly, as Unix tools do.
            _stdout_to_devnull()
            return 0
        expected = _expected(exc)
        if expected is None:
            raise
        print(f"zidane-actors: error: {expected}", file=sys.stderr)
        return 1
    try:
        sys.stdout.flush()  # here, not at exit: a reader gone is caught here
    except BrokenPipeError:
        _stdout_to_devnull()  # the command is done: its own exit code stands
    return code


def _reader_gone(exc: BaseException) -> bool:
    """Whether ``exc`` is ``BrokenPipeError`` (or a group of them): our output's reader left."""
    if isinstance(exc, BaseExceptionGroup):
        return all(_reader_gone(e) for e in exc.exceptions)
    return isinstance(exc, BrokenPipeError)


def _stdout_to_devnull() -> None:
    """Point stdout at /dev/null, so the interpreter's flush at exit does not raise EPIPE again.

    What the Python docs recommend for SIGPIPE (library/signal.html, "Note on SIGPIPE").
    """
    try:
        fd = sys.stdout.fileno()
    except (OSError, ValueError):  # not a real file (captured in tests): nothing to flush at exit
        return
    devnull = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(devnull, fd)
    finally:
        os.close(devnull)


def _expected(exc: BaseException) -> BaseException | None:
    """The library or OS error ``exc`` is (or a nursery's group wraps), else ``None``."""
    if isinstance(exc, (ZidaneActorsError, OSError)):
        return exc
    if isinstance(exc, BaseExceptionGroup):
        leaves = [_expected(e) for e in exc.exceptions]
        if leaves and all(leaf is not None for leaf in leaves):
            return leaves[0]
    return None


if __name__ == "__main__":
    sys.exit(main())
