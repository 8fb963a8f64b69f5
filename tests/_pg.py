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
from typing import Any

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


@contextmanager
def schema_at(version: int) -> Iterator[tuple[str, psycopg.Connection[Any]]]:
    """A new schema of ``DSN`` migrated by the store's own steps up to ``version`` (a
    database an older release left), and a connection using it; dropped afterwards."""
    from zidane_actors.stores.postgres import _schema

    name = f"test_{uuid.uuid4().hex[:16]}"
    with psycopg.connect(DSN, autocommit=True) as conn:
        conn.execute(sql.SQL("CREATE SCHEMA {}").format(sql.Identifier(name)))
        try:
            conn.execute(sql.SQL("SET search_path TO {}").format(sql.Identifier(name)))
            conn.execute(
                "CREATE TABLE schema_version (version integer PRIMARY KEY,"
                " applied_at timestamptz NOT NULL DEFAULT now())"
            )
            for step in range(1, version + 1):
                conn.execute(_schema._MIGRATIONS[step - 1].encode())
                conn.execute("INSERT INTO schema_version (version) VALUES (%s)", (step,))
            yield name, conn
        finally:
            conn.execute(sql.SQL("DROP SCHEMA IF EXISTS {} CASCADE").format(sql.Identifier(name)))
