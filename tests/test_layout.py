"""The package's layout stays as docs/architecture.md draws it (AST only, no imports).

- Every import runs downward: a module imports only its own layer and those
  beneath it (``errors.py`` and ``_nursery.py`` are beneath every layer).
- No module grows past :data:`MAX_LINES`; the few still past it (being split)
  may only shrink.
- No SQL statement is written in both the SQLite and the PostgreSQL store; the
  statements they still share (being moved to one place) may only go away.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

PACKAGE = Path(__file__).resolve().parent.parent / "zidane_actors"

RANKS = {
    "errors": 0,
    "_nursery": 0,
    "model": 1,
    "wire": 2,
    "stores": 3,
    "actors": 4,
    "server": 5,
    "_transfer": 6,
    "cli": 6,
    "__main__": 6,
    "portal": 7,
    "integrations": 8,
    "__init__": 9,
    "__version__": 0,  # a constant of the package's root, importing nothing
}
"""Each top-level module or package of ``zidane_actors`` by layer (docs/architecture.md)."""

MAX_LINES = 1_000

STILL_LONGER: dict[str, int] = {}
"""Modules still over :data:`MAX_LINES`, with the most lines each may have until split."""

STILL_SHARED_SQL = 0
"""SQL statements both SQL stores still write (each only to go away)."""


def _modules() -> list[Path]:
    return sorted(PACKAGE.rglob("*.py"))


def _top(path: Path) -> str:
    return path.relative_to(PACKAGE).parts[0].removesuffix(".py")


def _imported_tops(path: Path) -> set[str]:
    """The top-level parts of ``zidane_actors`` this module imports (any depth in its body)."""
    package = path.relative_to(PACKAGE).parts[:-1]
    found: set[str] = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if isinstance(node, ast.ImportFrom):
            if node.level:
                base = package[: len(package) - (node.level - 1)]
                parts = [*base, *(node.module.split(".") if node.module else [])]
                names = [parts] if parts else [[alias.name] for alias in node.names]
            elif node.module and node.module.split(".")[0] == "zidane_actors":
                names = [node.module.split(".")[1:]]
            else:
                continue
            for name in names:
                if name:
                    found.add(name[0])
        elif isinstance(node, ast.Import):
            for alias in node.names:
                parts = alias.name.split(".")
                if parts[0] == "zidane_actors" and len(parts) > 1:
                    found.add(parts[1])
    return found


def test_every_import_runs_downward() -> None:
    upward = []
    for path in _modules():
        own = _top(path)
        rank = RANKS[own]
        for other in _imported_tops(path) - {own}:
            if RANKS[other] > rank:
                upward.append(f"{path.relative_to(PACKAGE)} imports {other}")
    assert not upward, "imports running up the layers:\n" + "\n".join(upward)


def test_no_module_grows_past_the_limit() -> None:
    over = []
    for path in _modules():
        rel = path.relative_to(PACKAGE).as_posix()
        lines = len(path.read_text(encoding="utf-8").splitlines())
        limit = STILL_LONGER.get(rel, MAX_LINES)
        if lines > limit:
            over.append(f"{rel}: {lines} lines (at most {limit})")
    assert not over, "\n".join(over)


def _statements(paths: list[Path]) -> set[str]:
    """SQL statements written in these modules, placeholders and spacing normalized."""
    found = set()
    for path in paths:
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                text = " ".join(node.value.split())
                if re.match(r"(SELECT|INSERT|UPDATE|DELETE|CREATE|WITH)\b", text):
                    found.add(re.sub(r"%s|\$\d+", "?", text))
    return found


def test_the_sql_stores_share_no_more_statements() -> None:
    stores = PACKAGE / "stores"
    modules = sorted(stores.rglob("*.py"))  # by path: a store's package counts whole
    sqlite = _statements([p for p in modules if "sqlite" in p.relative_to(stores).as_posix()])
    postgres = _statements([p for p in modules if "postgres" in p.relative_to(stores).as_posix()])
    shared = sorted(sqlite & postgres)
    assert len(shared) <= STILL_SHARED_SQL, "SQL written twice:\n" + "\n".join(shared)
