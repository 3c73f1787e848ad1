"""The device side of a sync (PROTOCOL §8, §9): pull, verify, decrypt, apply; then push.

A sync pulls first, so every local edit is pushed with a clock above every version
this device has seen, and a remote version that beats an unpushed local edit is
detected here, on the device whose edit loses (the loser goes to `sync_conflicts`).
A push the relay rejects (it holds a version with a clock >= ours) is followed by
another pull and push, a bounded number of times.
"""

from __future__ import annotations

import functools
import logging
import sqlite3
from collections.abc import Callable, Mapping
from typing import Final

from msgspec import UnsetType

from engram_sync.shared_format.blob import NONCE_LEN, TAG_LEN, BlobCipher
from engram_sync.shared_format.digest import DigestAnswer
from engram_sync.shared_format.errors import FormatError
from engram_sync.shared_format.padding import pad_plaintext, padded_size
from engram_sync.shared_format.plaintext import (
    MemoryPlaintext,
    Tombstone,
    decode_plaintext,
    encode_memory,
    tombstone_plaintext,
)
from engram_sync.shared_format.sync_keys import SyncKeys
from engram_sync.shared_format.timestamps import utc_now_rfc3339
from engram_sync.shared_format.vault import Vault
from engram_sync.shared_format.wire import (
    MAX_PULL_LIMIT,
    PullResponse,
    PushResponse,
    SyncBlob,
    VaultDigest,
)

from .._errors import (
    AnswerTooLargeError,
    DeviceRevokedError,
    InvalidBlobError,
    RelayMisbehavedError,
    ResyncRequiredError,
    SyncError,
    VaultRetiredError,
)
from .._http.relay_client import PULL_PAGE_BUDGET_BYTES, RelayClient
from .._vault.fresh_apply import FreshBatch, fresh_ids, sync_cache
from .._vault.history import PULL, PULL_DELETE, PageKeeper, Writer, keep_version, tool_of
from .._vault.kept_digest import fold_changes
from .._vault.privacy import without_local_links
from .._vault.store import (
    KnownVersion,
    PendingTombstone,
    apply_memory,
    apply_tombstone,
    clear_tombstone,
    count_to_push,
    has_sync_history,
    known_version,
    local_state,
    mark_accepted,
    mark_pushed,
    memories_of_rows,
    pending_tombstones,
    push_keys,
    record_conflict,
    remember_version,
    remote_wins,
    repush_missing,
    rows_needing_push,
)
from .._vault.vault_key_store import (
    KeysDoNotOpenVaultError,
    key_source,
    keys_open_blobs,
    keys_refused_message,
)
from .anti_entropy import (
    CARRIED_FEATURE,
    DIGEST_FEATURE,
    AntiEntropy,
    carried_answer,
    carried_of,
)
from .ask_ahead import AskAhead, PullAsk
from .device import Device
from .feed_page_bound import feed_page_gap
from .lock import DEFAULT_WAIT_SECS as DEFAULT_LOCK_WAIT_SECS
from .lock import sync_lock
from .own_pushes import OwnSkip, own_commit_end, refuted_start
from .page_group import GroupBound, PageGroup
from .push_pipeline import DEFAULT_DEPTH as DEFAULT_PUSH_DEPTH
from .push_pipeline import DEFAULT_GROUP as DEFAULT_SETTLE_GROUP
from .push_pipeline import Item, PushPipeline, Sent
from .reports import DigestReport, ProgressCallback, SyncReport
from .retirement import note_retired, retired_error
from .revocation import revoked_in_roster, revoked_message
from .state import SkippedBlob, SyncState
from .strict_local import kept_out, push_retractions
from .unpushable import Unpushable, id_refusal, refused_index

log = logging.getLogger(__name__)

PUSH_BATCH: Final = 500  # PROTOCOL §8
PULL_PAGE: Final = 1000
DEFAULT_MAX_BLOB_BYTES: Final = 1_048_576
MAX_ROUNDS: Final = 3
# docs/when-the-relay-lies.md "Clock bound" (issue 13): a verified blob whose clock is more
# than this above the device's clock is skipped and reported instead of raising the clock.
# No honest vault gets near it (2^32 encryptions by one device), and one blob at 2^63-1 no
# longer makes every later push of every device overflow.
MAX_CLOCK_STEP: Final = 2**32
CLOCK_JUMP_REASON: Final = "vector clock jumps more than 2^32 above this device's clock"
MAX_CURSOR: Final = 2**63 - 1


def _origin(origin: int, cursor: int) -> int | None:
    """A pull that began at 0 tells the relay so: it has seen every blob that survived
    compaction below its cursor (docs/pull-origin.md)."""
    return 0 if origin == 0 and cursor > 0 else None


def _ciphertext_chars(plaintext_bytes: int) -> int:
    raw = NONCE_LEN + plaintext_bytes + TAG_LEN
    return 4 * ((raw + 2) // 3)


def _live(blob: SyncBlob, decoded: MemoryPlaintext | Tombstone) -> MemoryPlaintext | None:
    """The memory a verified blob carries, or None for a deletion (PROTOCOL §4, §8)."""
    if isinstance(decoded, MemoryPlaintext) and not blob.deleted:
        return decoded
    return None


def check_page(page: PullResponse, *, asked: int, limit: int, relay_url: str) -> None:
    """Refuse a cursor page no honest relay sends (PROTOCOL §9; issue 13): a missing
    cursor, one that goes back, passes 2^63-1 or the vault's sequence (`head`), jumps
    without blobs, or blobs whose sequence numbers do not lead to it (except a last page
    ending at exactly `head`: compacted tombstones, §12). Every page with
    blobs moves the cursor forward, so a relay repeating a page cannot keep the device
    pulling forever."""

    what = page_problem(page, asked=asked, limit=limit)
    if what is not None:
        raise RelayMisbehavedError(
            f"the relay at {relay_url} {what} (asked for blobs after cursor {asked}); the "
            "page was refused and nothing of it applied: the relay is faulty or lying, tell "
            "its operator"
        )


def page_problem(page: PullResponse, *, asked: int, limit: int) -> str | None:
    """What makes a cursor page one no honest relay sends (check_page), or None."""
    cursor = page.cursor
    if not isinstance(cursor, int):
        return "answered a cursor pull without a cursor (PROTOCOL §9)"
    if cursor > MAX_CURSOR:
        return f"sent cursor {cursor}, above 2^63-1"
    if cursor < asked:
        return f"moved the cursor back to {cursor}"
    if isinstance(page.head, int) and cursor > page.head:
        return f"sent cursor {cursor}, past the vault's sequence {page.head}"
    if len(page.blobs) > limit:
        return f"sent {len(page.blobs)} blobs for a page of at most {limit}"
    # PROTOCOL §9, §12 (issue 14 item 9): the last page of a vault whose newest entries are
    # compacted tombstones ends at the vault's sequence, past its last blob (or, with no
    # blob at all, past the asked cursor): otherwise the cursor would stay below the
    # compaction horizon and every later sync would be told to resync. Accepted only for
    # exactly `head` on a last page. The trade-off: a lying relay can use it to make the
    # device skip to the head, which it could already do by giving one real blob a forged
    # `seq` (not covered by the HMAC of §3); the cursor still never passes `head`.
    to_head = not page.has_more and isinstance(page.head, int) and cursor == page.head
    if not page.blobs:
        if cursor != asked and not to_head:
            return f"moved the cursor to {cursor} without sending any blob"
        if page.has_more:
            return "announced more blobs but sent none (no progress)"
        return None
    return _sequence_problem(page, cursor, asked=asked, to_head=to_head)


def _sequence_problem(page: PullResponse, cursor: int, *, asked: int, to_head: bool) -> str | None:
    """A page with blobs: their sequence numbers rise from `asked` and lead to the cursor,
    which moves (PROTOCOL §9)."""
    previous = asked
    for blob in page.blobs:
        if isinstance(blob.seq, int):
            if blob.seq <= previous:
                return f"sent blob sequence {blob.seq} after {previous}"
            previous = blob.seq
    if previous != asked and cursor != previous and not (to_head and cursor > previous):
        return f"sent cursor {cursor} after a last blob of sequence {previous}"
    if cursor == asked:
        return "sent blobs without moving the cursor (no progress)"
    return None


class Syncer:
    """Synchronises one open vault with one relay vault."""

    def __init__(
        self,
        vault: Vault,
        keys: SyncKeys,
        device: Device,
        state: SyncState,
        relay: RelayClient,
        vault_id: str,
        *,
        progress: ProgressCallback | None = None,
        push_batch: int = PUSH_BATCH,
        pull_page: int = PULL_PAGE,
        lock_wait: float = DEFAULT_LOCK_WAIT_SECS,
        page_budget: int = PULL_PAGE_BUDGET_BYTES,
        check_digest: bool = True,
        digest_when_behind: bool = True,
        push_depth: int = DEFAULT_PUSH_DEPTH,
        settle_group: int = DEFAULT_SETTLE_GROUP,
        group_bound: GroupBound | None = None,
    ) -> None:
        self.vault = vault
        self.keys = keys
        self.cipher = BlobCipher(keys)
        self.device = device
        self.state = state
        self.relay = relay
        self.vault_id = vault_id
        self.progress = progress or (lambda phase, report: None)
        self.push_batch = push_batch
        self.push_depth = push_depth  # batches outstanding at once (client._sync.push_pipeline)
        self.settle_group = settle_group  # answered batches marked in one transaction (same)
        self.pull_page = pull_page
        self.group_bound = group_bound or GroupBound()  # pages per transaction (page_group)
        self.lock_wait = lock_wait
        self.page_budget = page_budget
        self._max_blob_bytes: int | None = None
        self._saves_at_end = False  # inside `sync`: its end saves the state (`_take_page`)
        self.check_digest = check_digest
        # False (the live loop): the sync's digest check is not narrowed while the relay's
        # digest counts commits this sync did not pull; their change hint brings the next
        # sync, which pulls them and checks again (docs/digest.md "While others push")
        self.digest_when_behind = digest_when_behind
        # ours (docs/digest.md "Carried in push and pull answers"): the vault's §18 digest as
        # the last pull page or push answer of this sync carried it, for its end check
        self.carried: VaultDigest | None = None

    # -- the whole cycle --------------------------------------------------------------------

    def sync(self, *, feed_pages: Mapping[int, PullResponse] | None = None) -> SyncReport:
        """Pull, then push; pull and push again while the relay rejects stale clocks.

        One sync per vault directory at a time (client._sync.lock); under the lock the
        device clock and the sync state are read again from disk, since another process
        may have synced since this one loaded them. `feed_pages`: pages the live feed
        carried, by the cursor they follow (`pull`).
        """
        with sync_lock(self.state.path.parent, wait=self.lock_wait):
            self.device.refresh()
            self.state.refresh()
            self._saves_at_end = True  # `_sync_locked` saves the state whatever happens
            try:
                with sync_cache(self.vault.conn):  # client._vault.fresh_apply
                    return self._sync_locked(feed_pages or {})
            finally:
                self._saves_at_end = False

    def _sync_locked(self, feed_pages: Mapping[int, PullResponse]) -> SyncReport:
        report = SyncReport()
        self.carried = None
        # this sync's pushes and pulls ask for the vault's digest in their answers (ours)
        self.relay.ask_digest = self.check_digest and self.relay.offers(CARRIED_FEATURE)
        try:
            for round_ in range(MAX_ROUNDS):
                self.pull(report, feed_pages if round_ == 0 else None)
                if self.state.retired is not None:
                    break  # PROTOCOL §19: no push to a retired vault; the edits stay pending
                if self.state.revoked:
                    self._ask_again_if_revoked()  # before any push (client._sync.revocation)
                rejected_before = report.rejected
                self.push(report)
                if self.state.retired is not None:
                    break
                if report.rejected == rejected_before and not self.state.full_pull:
                    break
            if self.state.retired is not None:
                raise self._retired_error()
            if self.check_digest and self.relay.offers(DIGEST_FEATURE):
                # a digest this sync's last answer carried, when it is of the state the
                # sync ends at, spares the check its `GET /digest` (ours, docs/digest.md)
                carried = carried_answer(self.carried, cursor=self.state.cursor)
                report.digest = self.anti_entropy(report, repair=True, carried=carried)
            self.state.last_error = None
            self.state.last_sync_at = utc_now_rfc3339()
        except DeviceRevokedError:
            self._mark_revoked()
            raise self._revoked_error() from None
        except SyncError as exc:
            self.state.last_error = str(exc)
            raise
        finally:
            self.state.save()
        return report

    def revoked_by_relay(self, why: str) -> DeviceRevokedError:
        """The relay said this device is revoked (the live feed's `event: revoked`,
        PROTOCOL §15): remembered like a push answer naming it (§8), and the error to raise;
        the next sync asks again (client._sync.revocation)."""
        self._mark_revoked()
        error = self._revoked_error()
        return DeviceRevokedError(error.status, error.code, f"{error.message} ({why})")

    def anti_entropy(
        self, report: SyncReport, *, repair: bool, carried: DigestAnswer | None = None
    ) -> DigestReport:
        """PROTOCOL §18: compare this device's digest with the relay's; on a mismatch
        narrow it down by bucket and, with `repair`, fetch what the device lacks and push
        what the relay lacks (client._sync.anti_entropy; docs/digest.md). `carried`: the
        relay's digest as an answer of this sync carried it (`carried_answer`), compared
        first in place of a `GET /digest`."""
        checker = AntiEntropy(self, report, when_behind=self.digest_when_behind, carried=carried)
        return checker.run(repair=repair)

    def retired_by_relay(self) -> None:
        """The live feed said the vault was retired (`event: retired`, PROTOCOL §19): only a
        wake-up; the next sync's pull says whether it is (and that sync ends with the
        words for the person), so a feed that lies costs one pull."""
        log.info("the relay's live feed says vault %s was retired; pulling", self.vault_id)

    def _retired_error(self) -> VaultRetiredError:
        assert self.state.retired is not None
        rows, tombstones = count_to_push(self.vault.conn)
        return retired_error(
            self.state.retired,
            pending=rows + tombstones,
            key_source=key_source(self.vault.conn, self.vault_id),
        )

    def _note_retired(
        self, successor: object, erase_after: object, source: str, said: object = None
    ) -> None:
        # PROTOCOL §19: `said` (a 410 or a pull's `retired`) carries the successor statement
        hint = note_retired(
            self.state, self.vault_id, successor=successor, erase_after=erase_after,
            source=source, statement=getattr(said, "statement", None),
            stated_at=getattr(said, "stated_at", None),
        )  # fmt: skip
        self.state.save()
        log.warning(
            "the relay says vault %s was retired (successor %s, from a %s); not pushing to it",
            self.vault_id, hint.successor, source,
        )  # fmt: skip

    def _revoked_error(self) -> DeviceRevokedError:
        message = revoked_message(self.device.device_id, self.vault_id)
        return DeviceRevokedError(403, "device_revoked", message)

    def _ask_again_if_revoked(self) -> None:
        """The relay said this device was revoked, at an earlier sync: its word is a state
        to check again (issue 31; client._sync.revocation), not a verdict kept for good.
        After a pull that worked, the vault's roster decides, before anything is pushed
        (PROTOCOL §8: no push while the relay says revoked)."""
        if revoked_in_roster(self.relay.devices(self.vault_id), self.device.device_id):
            raise self._revoked_error()
        log.warning(
            "the relay no longer says this device (%s) is revoked for vault %s; syncing again",
            self.device.device_id, self.vault_id,
        )  # fmt: skip
        self.state.revoked = False
        self.state.save()

    def _mark_revoked(self) -> None:
        self.state.revoked = True
        self.state.save()

    # -- pull -------------------------------------------------------------------------------

    def pull(
        self, report: SyncReport, feed_pages: Mapping[int, PullResponse] | None = None
    ) -> None:
        """Page through the relay with the commit-ordered cursor, applying each page.

        `feed_pages` (docs/live-feed.md "Blobs in the event"): pages the live feed carried,
        each by the cursor it follows; one that follows the cursor reached is taken in place
        of that HTTP pull, after the same checks, if it passes `_feed_page`.

        Every page is checked before anything of it is applied (check_page: the relay is
        untrusted). A full re-pull from cursor 0 happens after 409 `resync_required`
        (PROTOCOL §9) and when the relay was restored (§17: a new generation, or the
        vault's sequence below our cursor); it ends in a reconcile that re-pushes what the
        relay lacks and deletes nothing (missing is not deleted). An interrupted full
        re-pull starts again from 0 at the next sync (`state.full_pull`).
        """
        # several pages a transaction, the cursor moved only after their COMMIT (page_group),
        # and the next page asked for while one is applied (ask_ahead)
        group = PageGroup(self.vault, self._committed, bound=self.group_bound)
        ahead = AskAhead(self._fetch)
        try:
            with group.held():
                ended = self._pull_pages(report, dict(feed_pages or {}), group, ahead)
        except BaseException as exc:
            # Ctrl-C or an exit does not wait for a page asked ahead of a relay that may
            # never answer; any other error does (the relay client stays one thread's)
            ahead.close(wait=isinstance(exc, Exception))
            raise
        ahead.close()
        if ended is not None:
            page, seen, retired = ended
            self._end_pull(page, report, seen, retired=retired)

    def _pull_pages(  # long: the pull's cases in the order they are met, one loop
        self,
        report: SyncReport,
        fed: dict[int, PullResponse],
        group: PageGroup,
        ahead: AskAhead,
    ) -> tuple[PullResponse, dict[str, int] | None, bool] | None:
        """`pull`'s loop over pages: the last page, the memories a full re-pull saw and
        whether a page said the vault is retired; None when the vault is past its grace
        period (PROTOCOL §19). Every step that writes the sync state commits the group of
        pages first."""
        seen = self._pull_start(report)
        cursor = origin = 0 if seen is not None else self.state.cursor
        limit = self.pull_page
        retired = False  # PROTOCOL §19: whether a page of this pull said the vault is retired
        while True:
            try:
                page, from_feed = self._next_page(fed, cursor, limit, origin, report, seen, ahead)
            except ResyncRequiredError:
                if seen is not None:
                    raise
                group.commit()
                seen, report.resynced = self._start_full_pull(), True  # PROTOCOL §9
                cursor = origin = 0
                continue
            except AnswerTooLargeError:
                if limit == 1:
                    raise
                limit = max(1, limit // 2)  # an honest page of large blobs: ask for fewer
                continue
            except VaultRetiredError as exc:  # PROTOCOL §19: past the grace period
                group.commit()
                self._note_retired(exc.successor, None, "pull", exc)
                return None
            if seen is None and self._relay_restored(page, cursor):
                group.commit()
                seen, report.resynced, report.restored = self._start_full_pull(), True, True
                cursor = origin = 0
                continue
            if not from_feed:  # a feed page was checked by `_feed_page`, against its own bound
                check_page(page, asked=cursor, limit=limit, relay_url=self.relay.base_url)
            start = None if seen is not None else self._refuted_skip(page.blobs, cursor, group)
            if start is not None:
                report.own_skip_refuted = True
                cursor = origin = start
                continue
            assert isinstance(page.cursor, int)  # check_page
            following = None
            if page.has_more and (seen is not None or page.cursor not in fed):
                ask = PullAsk(page.cursor, limit, _origin(origin, page.cursor))
                following = functools.partial(ahead.start, ask)
            retired = self._take_page(page, cursor, report, seen, group, following) or retired
            cursor = page.cursor
            if not page.has_more:
                return page, seen, retired

    def _pull_start(self, report: SyncReport) -> dict[str, int] | None:
        """The memories seen by a full re-pull ({} to collect them), or None for a pull
        from the cursor."""
        if self.state.full_pull:
            report.resynced = True
            return {}
        if self.state.link_pull:
            # issue 17: a new link of a vault that synced elsewhere before; the reconcile
            # pushes what the new vault lacks (a vault without history pulls as usual)
            if has_sync_history(self.vault.conn):
                return {}
            self.state.link_pull = False
        return None

    def _next_page(
        self,
        fed: dict[int, PullResponse],
        cursor: int,
        limit: int,
        origin: int,
        report: SyncReport,
        seen: dict[str, int] | None,
        ahead: AskAhead,
    ) -> tuple[PullResponse, bool]:
        """The page after `cursor`: the one the live feed carried (not in a full re-pull),
        else the relay's answer; and whether it came from the feed."""
        page = self._feed_page(fed, cursor, report) if seen is None else None
        if page is not None:
            report.feed_pages += 1
            return page, True
        ask = PullAsk(cursor, limit, _origin(origin, cursor))
        answer = ahead.take(ask)  # the same request, sent while the last page was applied
        return (answer if answer is not None else self._fetch(ask)), False

    def _fetch(self, ask: PullAsk) -> PullResponse:
        return self.relay.pull(
            self.vault_id,
            cursor=ask.cursor,
            limit=ask.limit,
            max_bytes=self.page_budget,
            origin=ask.origin,
        )

    def _take_page(
        self,
        page: PullResponse,
        cursor: int,
        report: SyncReport,
        seen: dict[str, int] | None,
        group: PageGroup,
        following: Callable[[], None] | None,
    ) -> bool:
        """Apply a checked page in the pull's group of pages; the cursor moves past it once
        the group commits (`_committed`, PROTOCOL §9). `following` sends the next page's
        request ahead, once this page's keys are known to open the vault (ask_ahead). Whether
        the page said the vault is retired (§19)."""
        retired = not isinstance(page.retired, UnsetType)
        if not isinstance(page.retired, UnsetType):
            retirement = page.retired
            self._note_retired(retirement.successor, retirement.erase_after, "pull", retirement)
        if cursor == 0:
            self._check_keys_open(page.blobs)
        if following is not None:
            following()
        highest = self._apply_page(page.blobs, report, seen, group)
        self.device.observe(highest)
        assert isinstance(page.cursor, int)  # check_page
        report.cursor = page.cursor
        group.applied(
            cursor=page.cursor,
            has_more=page.has_more,
            blobs=len(page.blobs),
            ciphertext=sum(len(blob.ciphertext) for blob in page.blobs),
        )
        self.progress("pull", report)
        return retired

    def _committed(self, cursor: int, has_more: bool) -> None:
        """The pages up to `cursor` are committed: the cursor moves there (PROTOCOL §9)."""
        self.state.cursor = cursor
        if has_more or not self._saves_at_end:
            # the last page's cursor is written by the sync's own save, moments later: a
            # crash in between leaves the cursor behind rows already committed, never past
            # them, and the next pull takes that page again as known versions (PROTOCOL §9;
            # issue 36: two fsyncs fewer for a sync that pulls one page)
            self.state.save()

    def _end_pull(
        self, page: PullResponse, report: SyncReport, seen: dict[str, int] | None, *, retired: bool
    ) -> None:
        """After the last page: a full re-pull's reconcile (pushes what the relay lacks,
        deletes nothing), the generation, and a retirement no page repeated undone."""
        if seen is not None:
            report.repushed = self._reconcile(seen, new_link=self.state.link_pull)
            self.state.full_pull = self.state.link_pull = False
        if isinstance(page.generation, str):
            self.state.generation = page.generation
        self.carried = carried_of(page.vault_digest)  # the last page's (ours: §18 at its head)
        if not retired and self.state.retired is not None:
            # a whole pull without `retired`: the vault is live after all (a relay that said
            # otherwise lied, or was restored); pushing resumes, nothing was lost meanwhile
            log.warning("vault %s is not retired after all; pushing again", self.vault_id)
            self.state.retired = None
        if not self._saves_at_end:
            self.state.save()

    def _refuted_skip(self, blobs: list[SyncBlob], asked: int, group: PageGroup) -> int | None:
        """The cursor to pull again from when this page shows that a move past our own
        pushes stepped over more than them (client._sync.own_pushes); the moves inside the
        range pulled again are forgotten, so each refutation happens once."""
        skips = self.state.own_skips
        start = refuted_start(skips, blobs, self.device.device_id, asked)
        if start is None:
            return None
        group.commit()  # the pages applied so far, and their cursor, before it moves back
        log.warning(
            "the relay at %s sent one of this device's own blobs above the cursor its push "
            "answer gave; pulling again from cursor %d (issue 15, docs/live-sync.md)",
            self.relay.base_url, start,
        )  # fmt: skip
        self.state.own_skips = [skip for skip in skips if skip.end <= start]
        self.state.cursor = start
        self.state.save()
        return start

    def _feed_page(
        self, fed: dict[int, PullResponse], cursor: int, report: SyncReport
    ) -> PullResponse | None:
        """The live feed's page that follows `cursor`, if there is one and it holds up: the
        generation this device knows (PROTOCOL §17; a restore is left to an HTTP pull to
        find) and every check of a pull page. A page that fails is dropped, logged,
        counted (`feed_dropped`), and the device pulls over HTTP instead: the feed can only
        spare a pull, never fail one. Stricter than a pull page: its blobs carry every
        sequence number from `cursor` to its own, one each (client._sync.feed_page_bound)."""
        page = fed.pop(cursor, None)
        if page is None:
            return None
        known = self.state.generation
        if known is None or page.generation != known:
            log.info("blobs from the live feed of another generation dropped; pulling")
            report.feed_dropped += 1
            return None
        # issue 31 (12b): a page with no `head` of its own moves the cursor only over the
        # blobs it carries, so a forged `seq` cannot skip data or fake a restore (§17)
        gap = feed_page_gap(page, cursor) if page.blobs else "it carries no blob"
        if gap is not None:
            log.warning("blobs from the live feed dropped, pulling instead: %s", gap)
            report.feed_dropped += 1
            return None
        try:
            check_page(page, asked=cursor, limit=MAX_PULL_LIMIT, relay_url=self.relay.base_url)
        except RelayMisbehavedError as exc:
            log.warning("blobs from the live feed refused, pulling instead: %s", exc)
            report.feed_dropped += 1
            return None
        return page

    def _start_full_pull(self) -> dict[str, int]:
        self.state.full_pull = True
        self.state.save()
        return {}

    def _relay_restored(self, page: PullResponse, asked: int) -> bool:
        """PROTOCOL §17: another generation than the one stored with our cursor, or a vault
        sequence below our cursor, means the relay lost commits we had seen."""
        if self._generation_changed(page.generation):
            return True
        return isinstance(page.head, int) and page.head < asked

    def _generation_changed(self, generation: str | UnsetType) -> bool:
        known = self.state.generation
        return isinstance(generation, str) and known is not None and generation != known

    def _check_keys_open(self, blobs: list[SyncBlob]) -> None:
        """PROTOCOL §8 (issue 35): a blob this device cannot open yet never moves its cursor
        past it. Keys that open none of the vault's first page (a mistyped passphrase, a
        member device before the handoff) stop the sync before anything is applied, the
        cursor moved or pushed, instead of skipping the vault for good or forking it."""
        if keys_open_blobs(self.keys, blobs) is False:
            source = key_source(self.vault.conn, self.vault_id)
            raise KeysDoNotOpenVaultError(keys_refused_message(self.vault_id, source))

    def _apply_page(
        self,
        blobs: list[SyncBlob],
        report: SyncReport,
        seen: dict[str, int] | None,
        group: PageGroup,
    ) -> int:
        """Apply one page in the group's transaction (a savepoint of its own); returns the
        highest verified clock. Memories the vault holds nothing of are written in bulk
        (client._vault.fresh_apply), the others one by one, in the page's order (a batch
        is flushed before each of them)."""
        highest = 0
        with group.page() as conn:
            keeper = PageKeeper(conn, [blob.memory_id for blob in blobs], self.device.device_id)
            fresh = fresh_ids(conn, [blob.memory_id for blob in blobs])
            batch = FreshBatch()
            for blob in blobs:
                report.pulled += 1
                decoded = self._open_checked(blob, report, ceiling=highest)
                if decoded is None:
                    continue
                highest = max(highest, blob.vector_clock)
                if seen is not None and blob.vector_clock > seen.get(blob.memory_id, -1):
                    seen[blob.memory_id] = blob.vector_clock
                remote = KnownVersion(blob.vector_clock, blob.device_id, blob.created_at)
                if blob.memory_id in fresh:  # LWW, privacy, conflicts: decided (fresh_apply)
                    batch.add(blob.memory_id, _live(blob, decoded), remote)
                    report.applied += 1
                    continue
                batch.flush(conn)
                self._apply_opened(conn, blob, decoded, remote, report, keeper)
            batch.flush(conn)
            keeper.flush()  # the page's history rows, in its transaction
        return highest

    def _skip(self, blob: SyncBlob, reason: str, report: SyncReport) -> bool:
        report.invalid += 1
        self.state.record_skipped(
            SkippedBlob(
                memory_id=blob.memory_id[:256],
                device_id=blob.device_id[:256],
                vector_clock=blob.vector_clock,
                reason=reason,
                seen_at=utc_now_rfc3339(),
                keys=key_source(self.vault.conn, self.vault_id),
            )
        )
        return False

    def _apply_blob(
        self,
        conn: sqlite3.Connection,
        blob: SyncBlob,
        report: SyncReport,
        *,
        ceiling: int = 0,
        keeper: PageKeeper | None = None,
    ) -> bool:
        """Verify → decrypt → decode → LWW → apply (PROTOCOL §3, §4, §8). True if verified.
        `keeper`: the page's history keeper (`_apply_page`), else the replaced version is
        kept at once."""
        decoded = self._open_checked(blob, report, ceiling=ceiling)
        if decoded is None:
            return False
        remote = KnownVersion(blob.vector_clock, blob.device_id, blob.created_at)
        self._apply_opened(conn, blob, decoded, remote, report, keeper)
        return True

    def _open_checked(
        self, blob: SyncBlob, report: SyncReport, *, ceiling: int
    ) -> MemoryPlaintext | Tombstone | None:
        """Verify → decrypt → decode (PROTOCOL §3, §4) and the blob's own bounds; None when
        it is skipped (and reported)."""
        decoded, reason = self._opened(blob, ceiling)
        if reason is not None:
            self._skip(blob, reason, report)
            return None
        return decoded

    def _opened(
        self, blob: SyncBlob, ceiling: int
    ) -> tuple[MemoryPlaintext | Tombstone | None, str | None]:
        """(the blob's plaintext, None), or (None, why it is skipped)."""
        if blob.vault_id != self.vault_id:
            return None, "blob names another vault"
        refusal = id_refusal(blob.memory_id)
        if refusal is not None:  # PROTOCOL §6 step 1: no honest relay holds it (issue 31)
            return None, refusal.reason
        try:
            text = self.cipher.open(blob)
            decoded = decode_plaintext(text, expected_id=blob.memory_id)
        except FormatError as exc:
            return None, f"{type(exc).__name__}: {exc}"
        if blob.vector_clock > max(self.device.vector_clock, ceiling) + MAX_CLOCK_STEP:
            # docs/when-the-relay-lies.md "Clock bound": one blob must not exhaust every
            # device's clock
            return None, CLOCK_JUMP_REASON
        return decoded, None

    def _apply_opened(
        self,
        conn: sqlite3.Connection,
        blob: SyncBlob,
        decoded: MemoryPlaintext | Tombstone,
        remote: KnownVersion,
        report: SyncReport,
        keeper: PageKeeper | None,
    ) -> None:
        """LWW → apply (PROTOCOL §8) of a verified, decoded blob, one memory at a time."""
        known = known_version(conn, blob.memory_id)
        if not remote_wins(remote, known):
            report.stale += 1
            return
        deleted = blob.deleted or isinstance(decoded, Tombstone)
        own = self.device.device_id
        if kept_out(conn, blob.memory_id, decoded, deleted, remote, own, report):
            return  # PROTOCOL §8: a strict_local memory is not overwritten (privacy.md)
        incoming = (
            tombstone_plaintext(blob.memory_id)
            if isinstance(decoded, Tombstone) or deleted
            else encode_memory(decoded)
        )
        held = local_state(conn, blob.memory_id)
        local = held.unpushed
        if local is not None and blob.device_id == self.device.device_id:
            self._own_push_returned(conn, blob, remote, decoded, local)
            report.stale += 1
            return
        if local is not None and local[0] != incoming:
            record_conflict(conn, blob.memory_id, local[0], local[1], remote, deleted)
            report.conflicts += 1
        live = _live(blob, decoded)
        if held.exists or known is not None:  # the version replaced is kept (docs/history.md)
            self._keep_replaced(conn, blob, live, known, keeper)
        if live is None:
            apply_tombstone(conn, blob.memory_id)
        else:
            apply_memory(conn, live, new=not held.exists)
        remember_version(conn, blob.memory_id, remote)
        report.applied += 1

    def _keep_replaced(
        self,
        conn: sqlite3.Connection,
        blob: SyncBlob,
        live: MemoryPlaintext | None,
        known: KnownVersion | None,
        keeper: PageKeeper | None,
    ) -> None:
        """Keep the version a pulled one replaces in the local history (docs/history.md):
        through the page's keeper (`known`: the memory's known version before this blob),
        or at once."""
        writer = Writer(
            blob.device_id,
            source=None if live is None else live.source,
            tool=None if live is None else tool_of(live.context),
            at=blob.created_at,
        )
        if keeper is not None:
            keeper.keep(
                blob.memory_id,
                PULL if live is not None else PULL_DELETE,
                writer,
                known,
                new_modified_at=None if live is None else live.modified_at,
            )
            return
        keep_version(
            conn,
            blob.memory_id,
            PULL if live is not None else PULL_DELETE,
            writer,
            own_device=self.device.device_id,
            new_modified_at=None if live is None else live.modified_at,
        )

    def _own_push_returned(
        self,
        conn: sqlite3.Connection,
        blob: SyncBlob,
        remote: KnownVersion,
        decoded: MemoryPlaintext | Tombstone,
        local: tuple[str, str | None],
    ) -> None:
        """One of our own pushes whose answer was lost comes back while we hold unpushed
        changes: it is older than them, so keep them and only record what the relay has."""
        remember_version(conn, blob.memory_id, remote)
        if isinstance(decoded, MemoryPlaintext) and not blob.deleted:
            if local[1] == decoded.modified_at:
                mark_pushed(conn, blob.memory_id, decoded.modified_at)
        elif local[1] is not None and tombstone_plaintext(blob.memory_id) == local[0]:
            clear_tombstone(conn, blob.memory_id, local[1])

    def _reconcile(self, seen: dict[str, int], *, new_link: bool = False) -> int:
        """After a full re-pull (PROTOCOL §9, §17): missing is not deleted. Every version
        this device holds that the relay lacks (the memory is absent there, or only an
        older version is) is pushed again; nothing is removed. After the first pull of a
        new link (issue 17) a deletion the new vault has never seen is pushed too.
        Returns how many."""
        with self.vault.transaction() as conn:
            return repush_missing(conn, seen, unseen_deletions=new_link)

    # -- push -------------------------------------------------------------------------------

    def _blob_limit(self) -> int:
        if self._max_blob_bytes is None:
            try:
                # asked once per relay client, i.e. per vault session (issue 36)
                self._max_blob_bytes = self.relay.known_info().max_blob_bytes
            except SyncError:  # a relay without /v1/info: the core's limit (PROTOCOL §6)
                self._max_blob_bytes = DEFAULT_MAX_BLOB_BYTES
        return self._max_blob_bytes

    def push(self, report: SyncReport) -> None:
        """Push changed rows, then pending tombstones, in batches (PROTOCOL §8).

        Each round lists the keys of the rows to push in one scan, oldest edit first, then
        pushes them batch by batch. A row edited meanwhile gets a newer modified_at, past
        the round's last key, so the next round finds it; rows left unpushed (rejected,
        oversized) are behind that key and not revisited by this push.
        """
        try:
            self._push_all(report)
        except VaultRetiredError as exc:
            # PROTOCOL §19: refused, nothing of the batch was marked pushed; it stays pending
            self._note_retired(exc.successor, None, "push", exc)

    def _push_all(self, report: SyncReport) -> None:
        keys = push_keys(self.vault.conn)
        bulk = len(keys) > self.push_batch  # else one batch or none: nothing to overlap
        with PushPipeline(
            lambda blobs: self.relay.push(self.vault_id, blobs),
            lambda group: self._settle(group, report),
            depth=self.push_depth if bulk else 1,
            group=self.settle_group if bulk else 1,
            stops=self._stops_push,
        ) as pipeline:
            after: tuple[str, str] | None = None
            while keys or (keys := push_keys(self.vault.conn, after=after)):
                for start in range(0, len(keys), self.push_batch):
                    batch = keys[start : start + self.push_batch]
                    rows = rows_needing_push(self.vault.conn, [memory_id for _, memory_id in batch])
                    self._seal_and_send(pipeline, self._row_items(rows, report), deleted=False)
                after, keys = keys[-1], []
                pipeline.drain()  # the next listing sees this round's rows marked pushed
            self.state.oversized = list(report.oversized)
            last: tuple[str, str] | None = None
            while tombs := pending_tombstones(self.vault.conn, self.push_batch, after=last):
                last = (tombs[-1].deleted_at, tombs[-1].memory_id)
                items = self._tombstone_items(tombs, report)
                self._seal_and_send(pipeline, items, deleted=True)
            pipeline.drain()
        push_retractions(self, report)  # `engram-sync retract` (docs/privacy.md)

    def _stops_push(self, answer: PushResponse | BaseException) -> bool:
        """Whether a batch's answer stops the push, so that the sender sends no batch
        sealed behind it (client._sync.push_pipeline): an error, unless it is a 400 naming
        a blob (`_answer` pushes the rest again and goes on), or this device revoked."""
        if isinstance(answer, BaseException):
            return not isinstance(answer, InvalidBlobError)
        return self.device.device_id in answer.revoked_devices

    def _push_shows_restore(self, response: PushResponse) -> bool:
        """PROTOCOL §17, as a push answer shows it: another generation, or the vault's
        sequence after our commit below the cursor we had pulled to."""
        if self._generation_changed(response.generation):
            return True
        return isinstance(response.cursor, int) and response.cursor < self.state.cursor

    def _skip_own_commit(
        self, response: PushResponse, sent: list[str], clocks: list[int], report: SyncReport
    ) -> None:
        """Move the cursor past our own commit when the answer shows nothing else was
        committed since our cursor (client._sync.own_pushes); else the next pull fetches it."""
        if self.state.full_pull:
            return
        start = self.state.cursor
        end = own_commit_end(response, cursor=start, sent=sent)
        if end is None:
            return
        self.state.cursor = end
        self.state.record_own_skip(OwnSkip(start, end, clocks[0], clocks[-1]))
        # issue 15: no fsynced save of its own; the sync's save (or the next page's) writes
        # it. A crash before that loses only this move, cursor and OwnSkip together: the
        # next pull fetches our blobs as stale versions (PROTOCOL §9). Everything else in
        # sync_state.json (revoked, retired, full_pull, ...) is saved where it is set.
        report.own_skipped += end - start
        report.cursor = end

    def _row_items(self, rows: list[sqlite3.Row], report: SyncReport) -> list[Item]:
        """(id, plaintext, modified_at) of the rows to push: their links and embeddings read
        in one query each for the batch (store.memories_of_rows, without waiting links, as
        row_to_plaintext reads them)."""
        items: list[Item] = []
        conn = self.vault.conn
        for row, memory in zip(rows, memories_of_rows(conn, rows, waiting=False), strict=True):
            refusal = id_refusal(row["id"])  # PROTOCOL §6 step 1: the batch would be a 400
            if refusal is not None:
                self._set_aside(refusal, report)
                continue
            text = encode_memory(without_local_links(conn, memory))  # privacy.md
            if _ciphertext_chars(padded_size(text)) > self._blob_limit():  # PROTOCOL §16
                if row["id"] not in report.oversized:
                    report.oversized.append(row["id"])
                continue
            items.append((row["id"], text, row["modified_at"]))
        return items

    def _tombstone_items(self, tombs: list[PendingTombstone], report: SyncReport) -> list[Item]:
        items: list[Item] = []
        for t in tombs:
            refusal = id_refusal(t.memory_id)  # PROTOCOL §6 step 1, as for rows
            if refusal is not None:
                self._set_aside(refusal, report)
                continue
            items.append((t.memory_id, tombstone_plaintext(t.memory_id), t.deleted_at))
        return items

    @staticmethod
    def _set_aside(refusal: Unpushable, report: SyncReport) -> None:
        if all(u.memory_id != refusal.memory_id for u in report.unpushable):
            report.unpushable.append(refusal)

    def _push_batch(self, items: list[Item], *, deleted: bool, report: SyncReport) -> None:
        """Seal, push and settle one batch at once (the retractions of strict_local)."""
        with PushPipeline(
            lambda blobs: self.relay.push(self.vault_id, blobs),
            lambda group: self._settle(group, report),
            depth=1,
            stops=self._stops_push,
        ) as pipeline:
            self._seal_and_send(pipeline, items, deleted=deleted)

    def _seal_and_send(self, pipeline: PushPipeline, items: list[Item], *, deleted: bool) -> None:
        if not items:
            return
        clocks = self.device.reserve_clocks(len(items))  # persisted before anything is sent
        blobs = [
            self.cipher.seal(
                pad_plaintext(text),  # PROTOCOL §16: every blob this device writes is padded
                vault_id=self.vault_id,
                memory_id=memory_id,
                device_id=self.device.device_id,
                vector_clock=clock,
                deleted=deleted,
            )
            for (memory_id, text, _), clock in zip(items, clocks, strict=True)
        ]
        pipeline.send(list(items), blobs, clocks, deleted=deleted)

    def _answer(self, sent: Sent, report: SyncReport) -> PushResponse | None:
        """The relay's answer to a sent batch. PROTOCOL §6 step 1: on a 400 naming a blob,
        nothing was written; that blob is kept local and reported, the others go again with
        the clocks they have (issue 31); None when none is left."""
        items, blobs, clocks = sent.items, sent.blobs, sent.clocks
        try:
            return sent.answer.result()
        except InvalidBlobError as exc:
            refused_error = exc
        while True:
            index = refused_index(refused_error.index, len(blobs))
            if index is None:
                raise refused_error
            refused = Unpushable(items[index][0], f"the relay refused it: {refused_error.reason}")
            self._set_aside(refused, report)
            del items[index], blobs[index], clocks[index]
            if not items:
                return None
            try:
                return self.relay.push(self.vault_id, blobs)
            except InvalidBlobError as exc:
                refused_error = exc

    def _settle(self, group: list[Sent], report: SyncReport) -> None:
        """Batches' answers, in the order they were sent: each checked for a restore or a
        revocation it shows and our own commit skipped (`_accepted`), then the accepted
        rows of them all marked pushed and their versions known in one transaction (one
        commit for the group: client._sync.push_pipeline). A batch whose answer raises
        still has the batches answered before it marked first."""
        accepted: list[tuple[Sent, list[tuple[Item, SyncBlob]]]] = []
        try:
            for sent in group:
                found = self._accepted(sent, report)
                if found is not None:
                    accepted.append((sent, found))
        finally:
            if accepted:
                self._mark_accepted(accepted, report)

    def _accepted(self, sent: Sent, report: SyncReport) -> list[tuple[Item, SyncBlob]] | None:
        """A batch's answer checked: the (item, blob) pairs the relay accepted; None when
        nothing of it is left to push (every blob refused as invalid)."""
        response = self._answer(sent, report)
        if response is None:
            return None
        items, blobs, clocks = sent.items, sent.blobs, sent.clocks
        if self._push_shows_restore(response):
            self.state.full_pull = True  # PROTOCOL §17: the next pull re-pulls and repairs
            self.state.save()
        if self.device.device_id in response.revoked_devices:
            self._mark_revoked()
            raise self._revoked_error()
        rejected = set(response.rejected)
        self._skip_own_commit(response, [m for m, _, _ in items], clocks, report)
        self.carried = carried_of(response.vault_digest)  # ours: §18 after the commit
        report.rejected += len(rejected)
        return [(item, blob) for item, blob in zip(items, blobs, strict=True)
                if item[0] not in rejected]  # fmt: skip

    def _mark_accepted(
        self, accepted: list[tuple[Sent, list[tuple[Item, SyncBlob]]]], report: SyncReport
    ) -> None:
        """PROTOCOL §8: the accepted rows marked pushed (tombstones cleared) and their
        versions known, for every batch given, in one transaction."""
        with self.vault.transaction() as conn:
            for sent, pairs in accepted:
                mark_accepted(
                    conn,
                    [(m, stamp) for (m, _, stamp), _ in pairs],
                    [(m, KnownVersion(b.vector_clock, b.device_id, b.created_at))
                     for (m, _, _), b in pairs],
                    deleted=sent.deleted,
                )  # fmt: skip
            fold_changes(conn)  # the kept digest, in the same transaction (issue 36)
        for _, pairs in accepted:
            report.pushed += len(pairs)
            self.progress("push", report)
