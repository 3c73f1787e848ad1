"""Where the relay's database comes from, for `serve` and every admin command.

`--database-url` > `ENGRAM_RELAY_DATABASE_URL` > `DATABASE_URL` > an embedded
PostgreSQL in `<data dir>/postgres`. An embedded server this process started is
stopped when the block ends; one already running (a `serve` elsewhere) is left up.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator
from pathlib import Path

from engram_sync.relay.db.embedded import EmbeddedPostgres, default_data_dir
from engram_sync.relay.db.failures import DatabaseFailureError, explain
from engram_sync.relay.db.migrate import upgrade_to_head
from engram_sync.relay.db.url import resolve_database_url

ADMIN_KEY_FILE = "admin-key"


def default_relay_dir() -> Path:
    """The relay's data dir: the parent of the embedded PostgreSQL's default data dir."""
    return default_data_dir().parent


@contextlib.contextmanager
def database(
    database_url: str | None, data_dir: Path | None, *, migrate: bool, citus: bool = False
) -> Iterator[str]:
    """Yield a usable database URL, starting (and later stopping) an embedded server if needed.

    ``citus``: migrate for Citus (create the extension, distribute the tables, issue 18);
    a database that has the extension is distributed by every migrate anyway.

    A database failure in the block (or in the migrations) leaves it as a
    `DatabaseFailureError`: one line saying what is wrong and what to do, chained to the
    driver's own error (relay.db.failures), for every command at once."""
    url = resolve_database_url(database_url)
    if url is not None:
        with _explained(url):
            if migrate:
                upgrade_to_head(url, citus_mode=citus)
            yield url
        return
    # attach/detach: the last process using the server stops it, and one that died
    # (SIGKILL, a crash) does not count, so the next one adopts and later stops its server.
    server = EmbeddedPostgres((data_dir or default_relay_dir()) / "postgres")
    url = server.attach()
    try:
        with _explained(url):
            if migrate:
                upgrade_to_head(url, citus_mode=citus)
            yield url
    finally:
        server.detach()


@contextlib.contextmanager
def _explained(url: str) -> Iterator[None]:
    try:
        yield
    except DatabaseFailureError:
        raise
    except Exception as exc:
        line = explain(exc, url)
        if line is None:
            raise
        raise DatabaseFailureError(line) from exc


def save_admin_key(data_dir: Path, key: str) -> Path:
    """Write the first admin key to `<data dir>/admin-key`, mode 0600, atomically."""
    data_dir.mkdir(parents=True, exist_ok=True)
    path = data_dir / ADMIN_KEY_FILE
    tmp = path.with_suffix(".tmp")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w", encoding="utf-8") as handle:
        handle.write(key + "\n")
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)
    return path
