"""Where the tests find PostgreSQL: ``ZIDANE_TEST_POSTGRES``, default the local ``test`` database.

The value is a libpq connection string or URL
(``postgresql://postgres@127.0.0.1:5432/test``); the tests create and drop
schemas in that database, and databases of their own on the same server.
"""

from __future__ import annotations

import os
import uuid
from collections.abc import Iterator
from contextlib import contextmanager

import psycopg
from psycopg import sql
from psycopg.conninfo import conninfo_to_dict, make_conninfo

DSN = os.environ.get("ZIDANE_TEST_POSTGRES") or "host=127.0.0.1 port=5432 user=postgres dbname=test"
"""The database the tests use (its schemas come and go)."""

_PARTS = conninfo_to_dict(DSN)
HOST = str(_PARTS.get("host") or "127.0.0.1")
PORT = int(_PARTS.get("port") or 5432)


def dsn_of(database: str) -> str:
    """``DSN`` naming another database of the same server."""
    return make_conninfo(DSN, dbname=database)


def url_of(database: str) -> str:
    """A ``postgresql://`` store URL of another database of the same server."""
    user = _PARTS.get("user")
    password = _PARTS.get("password")
    who = f"{user}:{password}@" if user and password else f"{user}@" if user else ""
    return f"postgresql://{who}{HOST}:{PORT}/{database}"


@contextmanager
def fresh_database(prefix: str) -> Iterator[str]:
    """The store URL of a new database on the same server, dropped (forced) afterwards."""
    name = f"{prefix}_{uuid.uuid4().hex[:12]}"
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
    try:
        yield url_of(name)
    finally:
        with psycopg.connect(DSN, autocommit=True) as conn:
            conn.execute(sql.SQL("DROP DATABASE {} WITH (FORCE)").format(sql.Identifier(name)))
