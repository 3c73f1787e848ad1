"""Several pulled pages in one SQLite transaction (issue 36; PROTOCOL §9).

A commit of the vault costs about what the pages it dirtied cost to encrypt and write: at
100,000 memories a page of 1,000 new ones touches most leaves of every index keyed by a
random value (ids, content hashes), so a commit per page rewrote the indexes once per
page, a third of a bulk pull's time. Pages of a bulk pull are applied in one transaction,
up to a bound (`group_full`); a small page (a live sync's, the end of a pull, a page
halved for large blobs) commits with the group before it, as one page did before. (Not a
SAVEPOINT per page: SQLCipher journals every page a savepoint changes, which made the
group ten times slower than the commits it saved.)

What the cursor promises is unchanged: it is set, and saved, only after the rows of every
page below it are committed (`PageGroup.commit` calls `on_commit` after COMMIT), so a
crash at any point leaves the cursor at or behind the committed rows and the next pull
takes the uncommitted pages again. An error while a page is applied rolls the whole
group back (the cursor stays where the last commit left it, and the next pull takes the
group's pages again); an error between pages (a refused or failed next page) commits the
pages applied before it goes on, as committing page by page did.

The relay records a device's pull progress when it serves a page (PROTOCOL §12), so its
record already ran one page ahead of the committed rows; now it may run a group ahead.
That changes nothing of what compaction may do: a device whose saved cursor turns out to
lie below the compaction horizon gets `resync_required` at its next pull (§9) and pulls
everything again, it never skips a deletion (docs/pull-progress.md).
"""

from __future__ import annotations

import logging
import sqlite3
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final

from engram_sync.shared_format.vault import Vault

from .._vault.kept_digest import fold_changes

GROUP_MEMORIES: Final = 5_000  # blobs in one transaction at most
GROUP_BYTES: Final = 8 * 1024 * 1024  # ciphertext characters in one transaction at most
GROUP_SECONDS: Final = 1.0  # the vault's write lock held across pages at most
GROUPED_PAGE: Final = 500  # a page of fewer blobs commits at once (with the group before it)


log = logging.getLogger(__name__)


@dataclass(frozen=True)
class GroupBound:
    """When an open group of pages commits (`group_full`)."""

    memories: int = GROUP_MEMORIES
    ciphertext: int = GROUP_BYTES
    seconds: float = GROUP_SECONDS
    grouped_page: int = GROUPED_PAGE


def group_full(
    bound: GroupBound, *, memories: int, ciphertext: int, seconds: float, last_page: int
) -> bool:
    """Whether a group holding `memories` blobs of `ciphertext` characters, open for
    `seconds`, whose last page carried `last_page` blobs, commits now rather than take the
    next page too."""
    return (
        last_page < bound.grouped_page
        or memories >= bound.memories
        or ciphertext >= bound.ciphertext
        or seconds >= bound.seconds
    )


class PageGroup:
    """The open transaction of a pull's pages; `on_commit(cursor, has_more)` after each
    COMMIT, with the cursor and `has_more` of the group's last page."""

    def __init__(
        self,
        vault: Vault,
        on_commit: Callable[[int, bool], None],
        *,
        bound: GroupBound | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.vault = vault
        self.on_commit = on_commit
        self.bound = bound or GroupBound()
        self.clock = clock
        self._opened_at: float | None = None
        self._memories = self._ciphertext = 0
        self._last: tuple[int, bool] | None = None  # the applied page's (cursor, has_more)

    @property
    def open(self) -> bool:
        return self._opened_at is not None

    @contextmanager
    def page(self) -> Iterator[sqlite3.Connection]:
        """One page's writes, in the group's transaction (begun if none is open); when the
        block raises, the whole group is rolled back and nothing of it moves the cursor."""
        conn = self.vault.conn
        if self._opened_at is None:
            conn.execute("BEGIN IMMEDIATE")
            self._opened_at = self.clock()
        try:
            yield conn
        except BaseException:
            self._forget()
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise

    def _forget(self) -> None:
        self._opened_at, self._last = None, None
        self._memories = self._ciphertext = 0

    def applied(self, *, cursor: int, has_more: bool, blobs: int, ciphertext: int) -> None:
        """A page was applied (its block ended without error): commit the group now if the
        bound says so, or if it was the pull's last page."""
        assert self._opened_at is not None
        self._memories += blobs
        self._ciphertext += ciphertext
        self._last = (cursor, has_more)
        full = group_full(
            self.bound,
            memories=self._memories,
            ciphertext=self._ciphertext,
            seconds=self.clock() - self._opened_at,
            last_page=blobs,
        )
        if full or not has_more:
            self.commit()

    def commit(self) -> None:
        """Fold the kept digest, COMMIT, then move the cursor (`on_commit`); nothing when no
        transaction is open. After an applied page the transaction is open, whatever
        happened since: a failed commit rolls it back and raises."""
        if self._opened_at is None:
            return
        conn, last = self.vault.conn, self._last
        self._forget()
        try:
            if conn.in_transaction:
                fold_changes(conn)  # the kept digest, in the pages' transaction (issue 36)
                conn.execute("COMMIT")
        except BaseException:
            if conn.in_transaction:
                conn.execute("ROLLBACK")
            raise
        if last is not None:
            self.on_commit(*last)

    @contextmanager
    def held(self) -> Iterator[None]:
        """Around a pull: whatever ends it, the pages applied are committed (the cursor
        moved past them); an error goes on after that."""
        try:
            yield
        except BaseException:
            try:
                self.commit()
            except Exception:  # the first error is the one to report; nothing was kept
                log.warning("the pulled pages before an error could not be committed")
            raise
        self.commit()
