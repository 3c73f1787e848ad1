"""Anti-entropy (PROTOCOL §18, docs/digest.md): compare the device's digest with the relay's,
narrow a mismatch down by bucket, and repair it.

One small answer when both sides agree (the vault digest). On a mismatch: every bucket's
digest prefix in one answer (`?buckets=1`), then for each bucket that differs the device
sends the prefixes of its 256 sub-bucket digests and the relay answers the versions of
the sub-buckets that differ (`POST .../digest/narrow`, feature `digest-narrow`; a relay
without it: the bucket's whole version list). From the lists:

- the relay holds a version that beats the device's, or one the device lacks: fetched
  (`POST /fetch`), verified and applied like a pulled blob (PROTOCOL §3, §8: LWW). One
  case more: the relay holds, live, exactly the version the device knows for a memory
  whose row the device no longer has and did not delete (the row went missing outside
  engram-sync): the verified blob is written back (restored);
- the device holds a version the relay lacks or holds only older: queued to push again
  (`held_versions.requeue`); a tombstone the relay lacks entirely was compacted (§12):
  left out of the device's digest from then on (`mark_compacted`), not re-pushed;
- a version the device already refused (skipped when pulled) under the keys it holds now
  is not fetched again; one refused under other keys is (PROTOCOL §8, issue 35);
- anything else (the relay claims a tombstone at the very version the device holds live,
  or two devices' versions with one clock): reported as unresolved, nothing changed.

The relay's digest as a push answer or a cursor pull's last page carried it (`vault_digest`,
ours: docs/digest.md "Carried in push and pull answers") stands in for the first
`GET /digest` when it is of the state the sync ends at (`carried_answer`: its sequence is
the device's cursor). Only a match ends the check on it; on a mismatch the check asks
`GET /digest` and goes on exactly as without it, so a carried value that lies costs a
request and decides nothing.

The relay is untrusted: its digests and lists only ever make the device fetch (blobs that
must verify, applied by the ordinary rules, so only a verified tombstone with a winning
clock deletes), push again, or leave a tombstone out of its own digest. Missing is not
deleted (§17), nothing is skipped: the cursor and the pushed state are never moved here.
Every loop is bounded (MAX_LIST_PAGES, MAX_FETCH_ROUNDS).
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Final

from msgspec import UnsetType

from engram_sync.shared_format.b64 import Base64Error, b64decode_std, b64encode_std
from engram_sync.shared_format.digest import (
    BUCKETS,
    MAX_FETCH_IDS,
    PREFIX_BYTES,
    SUB_BUCKETS,
    DigestAnswer,
    NarrowAnswer,
    NarrowRequest,
    Version,
    digest_bytes,
    digest_text,
    fold,
    slot_of,
)
from engram_sync.shared_format.errors import FormatError
from engram_sync.shared_format.plaintext import MemoryPlaintext, decode_plaintext
from engram_sync.shared_format.wire import SyncBlob, VaultDigest, encode_json

from .._errors import (
    ProtocolError,
    RateLimitedError,
    RelayMisbehavedError,
    RelayUnavailableError,
)
from .._vault.held_versions import (
    bucket_digests,
    by_bucket,
    mark_compacted,
    requeue,
)
from .._vault.kept_digest import held_and_kept, kept_digest
from .._vault.store import apply_memory, known_version, local_state
from .._vault.vault_key_store import key_source
from .reports import DigestReport

if TYPE_CHECKING:
    import sqlite3

    from .reports import SyncReport
    from .syncer_parts import SyncerParts

log = logging.getLogger(__name__)

DIGEST_FEATURE: Final = "digest"
NARROW_FEATURE: Final = "digest-narrow"  # POST .../digest/narrow (ours, docs/digest.md)
DEEP_FEATURE: Final = "digest-deep"  # ?deep=1: the digest from the relay's rows (ours)
# `?digest=1` on push and pull: the vault's digest carried in their answers (ours)
CARRIED_FEATURE: Final = "digest-carried"
MAX_LIST_PAGES: Final = 1000  # per bucket: 2,000,000 versions in one bucket at most
MAX_FETCH_ROUNDS: Final = 64  # per batch of at most 1000 ids (answers cut by bytes)
MAX_UNRESOLVED_SHOWN: Final = 20


def carried_of(field: VaultDigest | UnsetType) -> VaultDigest | None:
    """An answer's `vault_digest`, or None when it has none (an older relay)."""
    return field if isinstance(field, VaultDigest) else None


def carried_answer(carried: VaultDigest | None, *, cursor: int) -> DigestAnswer | None:
    """The carried digest as the vault answer of `GET /digest`, when it describes the state
    the sync ends at: its sequence is the device's cursor, so every commit it counts is
    one the device pulled or pushed (anything else, someone's push in between or a page
    short of the head, was carried at another sequence: None, the check asks)."""
    if carried is None or carried.cursor != cursor:
        return None
    return DigestAnswer(cursor=carried.cursor, count=carried.count, digest=carried.digest)


class AntiEntropy:
    """One check of one Syncer's vault against its relay."""

    def __init__(
        self,
        syncer: SyncerParts,
        report: SyncReport,
        *,
        deep: bool = False,
        when_behind: bool = True,
        carried: DigestAnswer | None = None,
    ) -> None:
        self.syncer = syncer
        self.sync_report = report
        self.result = DigestReport()
        # `verify --deep`: the vault's digest and bucket prefixes as the relay's rows give
        # them (`?deep=1`), not its stored totals, which a row lost outside a push leaves
        # claiming the version (docs/digest.md "The scrub")
        self.deep = deep
        # False: a mismatch while the relay's digest counts commits past this device's
        # cursor (others pushed since its pull) is not narrowed (`behind`): it is what
        # those commits make, and the sync their change hint brings checks again
        self.when_behind = when_behind
        # the vault answer an answer of the sync carried (`carried_answer`), used once
        self.carried = carried

    # -- asking ------------------------------------------------------------------------

    def _ask(
        self,
        *,
        bucket: int | None = None,
        entries: bool = False,
        every_bucket: bool = False,
        after: str = "",
    ) -> DigestAnswer:
        answer = self.syncer.relay.digest(
            self.syncer.vault_id,
            bucket=bucket,
            entries=entries,
            every_bucket=every_bucket,
            after=after,
            deep=self.deep and bucket is None,
        )
        self.result.round_trips += 1
        self.result.answer_bytes += len(encode_json(answer))
        return answer

    def _ask_narrow(self, request: NarrowRequest) -> NarrowAnswer:
        answer = self.syncer.relay.narrow(self.syncer.vault_id, request)
        self.result.round_trips += 1
        self.result.request_bytes += len(encode_json(request))
        self.result.answer_bytes += len(encode_json(answer))
        return answer

    def _refuse(self, what: str) -> RelayMisbehavedError:
        return RelayMisbehavedError(
            f"the relay at {self.syncer.relay.base_url} {what} (PROTOCOL §18); nothing was "
            "changed because of it: the relay is faulty or lying, tell its operator"
        )

    # -- the check ---------------------------------------------------------------------

    def run(self, *, repair: bool) -> DigestReport:
        """Compare; on a mismatch narrow down and, with `repair`, repair and compare again.

        The device's side is its kept digest (client._vault.kept_digest: O(changes), issue
        36); every held version is read only to narrow a mismatch, and by `verify --deep`,
        which also checks the kept value against them (`kept_repaired`).

        An answer no honest relay sends (a list out of order, one that never ends, a body
        of the wrong shape or size), or a relay that stops answering or rate-limits, ends
        the check with `error` set and `matched` False; the sync it ends is not failed by
        it (its pull and push are done, and nothing was changed on the strength of that
        answer). A revoked device or a refused key still raises."""
        result = self.result
        vault = self.syncer.vault
        try:
            plan = self.locate(self._held()) if self.deep else self._locate_kept()
            if result.matched:
                return result
            if repair and plan is not None:
                self._repair(*plan)
                self._matches(self._ask(), kept_digest(vault))
        except (ProtocolError, RelayUnavailableError, RateLimitedError) as exc:
            log.warning("anti-entropy check refused: %s", exc)
            result.error, result.matched = str(exc), False
        return result

    def _held(self) -> list[Version]:
        """Every held version; the kept digest checked against them and put right."""
        held, wrong = held_and_kept(self.syncer.vault)
        if wrong:
            log.warning("this device's kept digest disagreed with its rows; recomputed")
            self.result.kept_repaired = True
        return held

    def locate(self, held: list[Version]) -> tuple[list[str], list[Version], list[Version]] | None:
        """Compare `held` with the relay's digest; on a mismatch narrow it down: (memory ids
        the device lacks, held versions the relay lacks, tombstones it compacted), or None
        when they agree or the relay's bucket answer is unusable. Changes nothing."""
        self.result.checked = True
        top = self._ask()
        if self._matches(top, fold(held)):
            return None
        return self._mismatch(top, held)

    def _locate_kept(self) -> tuple[list[str], list[Version], list[Version]] | None:
        """`locate` with the kept digest: the held versions are read only on a mismatch
        (and a kept value found wrong then is put right and compared again)."""
        self.result.checked = True
        kept = kept_digest(self.syncer.vault)
        if self.carried is not None:
            self.result.carried = True
            if self._matches(self.carried, kept):
                self.result.round_trips += 1  # the one answer it rests on (no request)
                return None
        top = self._ask()  # none carried, or a mismatch: asked, and on as without it
        if self._matches(top, kept):
            return None
        if self._behind(top):
            return None
        held = self._held()
        if self.result.kept_repaired and self._matches(top, fold(held)):
            return None
        return self._narrow(held)

    def _mismatch(
        self, top: DigestAnswer, held: list[Version]
    ) -> tuple[list[str], list[Version], list[Version]] | None:
        return None if self._behind(top) else self._narrow(held)

    def _behind(self, top: DigestAnswer) -> bool:
        """docs/digest.md "While others push": not narrowed while the relay's digest counts
        commits past this device's cursor (the live loop's syncs)."""
        if not self.when_behind and top.cursor > self.syncer.state.cursor:
            self.result.behind = True
            return True
        return False

    def _matches(self, top: DigestAnswer, device: tuple[int, int]) -> bool:
        value, count = device
        result = self.result
        result.relay_digest, result.relay_count = top.digest, top.count
        result.device_digest, result.device_count = digest_text(value), count
        result.matched = top.digest == result.device_digest and top.count == count
        return result.matched

    def _narrow(self, held: list[Version]) -> tuple[list[str], list[Version], list[Version]] | None:
        """(ids to fetch, held versions to push again, tombstones compacted) over the
        buckets that differ; None when the relay's answers cannot be used."""
        every = self._ask(every_bucket=True)
        try:
            prefixes = b64decode_std(every.buckets) if isinstance(every.buckets, str) else b""
        except Base64Error:
            prefixes = b""
        counts = every.counts if isinstance(every.counts, list) else []
        if len(prefixes) != BUCKETS * PREFIX_BYTES or len(counts) != BUCKETS:
            log.warning("relay %s sent no usable bucket digests", self.syncer.relay.base_url)
            return None
        mine = bucket_digests(held)
        grouped = by_bucket(held)
        narrowing = self.syncer.relay.offers(NARROW_FEATURE)
        fetch: list[str] = []
        push: list[Version] = []
        gone: list[Version] = []
        for bucket in range(BUCKETS):
            digest, count = mine.get(bucket, (0, 0))
            theirs = prefixes[bucket * PREFIX_BYTES : (bucket + 1) * PREFIX_BYTES]
            if digest_bytes(digest)[:PREFIX_BYTES] == theirs and count == counts[bucket]:
                continue
            self.result.buckets.append(bucket)
            if narrowing:
                compared, relay_side = self._narrow_bucket(bucket, grouped.get(bucket, []))
            else:  # a relay without digest-narrow: the bucket's whole list
                compared, relay_side = grouped.get(bucket, []), self._bucket_list(bucket)
            self._diff(compared, relay_side, fetch, push, gone)
        self.result.device_lacks = len(fetch)
        self.result.relay_lacks = len(push)
        return fetch, push, gone

    def _narrow_bucket(
        self, bucket: int, mine: list[Version]
    ) -> tuple[list[Version], dict[str, Version]]:
        """(the device's versions, the relay's) of the sub-buckets of `bucket` the relay
        says differ, a page at a time. A sub-bucket counts only if every page named it
        (a page cannot half-list one); an entry outside the sub-buckets its page named,
        out of order, or a page that does not progress is refused (nothing changed)."""
        by_sub: dict[int, list[Version]] = {}
        for v in mine:
            by_sub.setdefault(slot_of(v.memory_id)[1], []).append(v)
        prefixes = b"".join(
            digest_bytes(fold(by_sub.get(sub, []))[0])[:PREFIX_BYTES] for sub in range(SUB_BUCKETS)
        )
        subs_text = b64encode_std(prefixes)
        agreed: set[int] | None = None
        listed: dict[str, tuple[int, Version]] = {}
        after = ""
        for _ in range(MAX_LIST_PAGES):
            page = self._ask_narrow(NarrowRequest(bucket=bucket, subs=subs_text, after=after))
            named = set(page.subs)
            if page.bucket != bucket or not all(0 <= s < SUB_BUCKETS for s in named):
                raise self._refuse(f"answered the narrowing of bucket {bucket} for another one")
            agreed = named if agreed is None else agreed & named
            for e in page.entries:
                if e.memory_id <= after:
                    raise self._refuse(f"listed bucket {bucket} out of order")
                where, sub = slot_of(e.memory_id)
                if where != bucket or sub not in named:
                    raise self._refuse(f"listed a memory outside the sub-buckets of {bucket}")
                after = e.memory_id
                listed[e.memory_id] = (
                    sub,
                    Version(e.memory_id, e.device_id, e.vector_clock, e.deleted),
                )
            if page.has_more is not True:
                compared = [v for sub in sorted(agreed) for v in by_sub.get(sub, [])]
                return compared, {m: v for m, (sub, v) in listed.items() if sub in agreed}
            if not page.entries:
                raise self._refuse(f"announced more of bucket {bucket} but sent none")
        raise self._refuse(f"listed more than {MAX_LIST_PAGES} pages of bucket {bucket}")

    def _bucket_list(self, bucket: int) -> dict[str, Version]:
        versions: dict[str, Version] = {}
        after = ""
        for _ in range(MAX_LIST_PAGES):
            page = self._ask(bucket=bucket, entries=True, after=after)
            entries = page.entries if isinstance(page.entries, list) else []
            for e in entries:
                if e.memory_id <= after:
                    raise self._refuse(f"listed bucket {bucket} out of order")
                after = e.memory_id
                versions[e.memory_id] = Version(e.memory_id, e.device_id, e.vector_clock, e.deleted)
            if page.has_more is not True:
                return versions
            if not entries:
                raise self._refuse(f"announced more of bucket {bucket} but sent none")
        raise self._refuse(f"listed more than {MAX_LIST_PAGES} pages of bucket {bucket}")

    def _diff(
        self,
        mine: list[Version],
        theirs: dict[str, Version],
        fetch: list[str],
        push: list[Version],
        gone: list[Version],
    ) -> None:
        held = {v.memory_id: v for v in mine}
        # PROTOCOL §8 (issue 35): a version refused under the keys this device holds now is
        # not fetched again; one refused under other keys (before a handoff brought K, or
        # recorded before issue 35) is fetched and verified again
        skipped = self.syncer.state.skipped
        keys = key_source(self.syncer.vault.conn, self.syncer.vault_id) if skipped else None
        refused = {(s.memory_id, s.device_id, s.vector_clock) for s in skipped if s.keys == keys}
        for memory_id, relay_version in theirs.items():
            local = held.get(memory_id)
            if (memory_id, relay_version.device_id, relay_version.vector_clock) in refused:
                self._unresolved(memory_id)  # a blob this device already refused (skipped)
            elif local is None or relay_version.vector_clock > local.vector_clock:
                fetch.append(memory_id)
            elif relay_version == local or relay_version.vector_clock < local.vector_clock:
                continue
            elif relay_version.device_id != local.device_id:
                fetch.append(memory_id)  # one clock, two devices (legacy): LWW decides
            elif local.deleted and not relay_version.deleted:
                fetch.append(memory_id)  # our row of this version went missing: restore
            else:
                self._unresolved(memory_id)  # a tombstone at the version we hold live
        for memory_id, version in held.items():
            relayed = theirs.get(memory_id)
            if relayed is None and version.deleted:
                gone.append(version)  # compacted (PROTOCOL §12): nothing left to delete
            elif relayed is None or relayed.vector_clock < version.vector_clock:
                push.append(version)

    def _unresolved(self, memory_id: str) -> None:
        self.result.unresolved.append(memory_id)

    # -- repairing ---------------------------------------------------------------------

    def _repair(self, fetch: list[str], push: list[Version], gone: list[Version]) -> None:
        syncer = self.syncer
        result = self.result
        for start in range(0, len(fetch), MAX_FETCH_IDS):
            self._fetch(fetch[start : start + MAX_FETCH_IDS])
        with syncer.vault.transaction() as conn:
            result.requeued = requeue(conn, push)
            mark_compacted(conn, gone)
            result.compacted = len(gone)
        if result.requeued:
            syncer.push(self.sync_report)

    def _fetch(self, memory_ids: list[str]) -> None:
        syncer = self.syncer
        wanted = set(memory_ids)
        for _ in range(MAX_FETCH_ROUNDS):
            answer = syncer.relay.fetch(syncer.vault_id, sorted(wanted))
            self.result.round_trips += 1
            blobs = [b for b in answer.blobs if b.memory_id in wanted]
            highest = 0
            with syncer.vault.transaction() as conn:
                for blob in blobs:
                    wanted.discard(blob.memory_id)
                    if self._apply(conn, blob, ceiling=highest):
                        highest = max(highest, blob.vector_clock)
            syncer.device.observe(highest)
            if not answer.has_more or not blobs or not wanted:
                return

    def _apply(self, conn: sqlite3.Connection, blob: SyncBlob, *, ceiling: int) -> bool:
        """Apply one fetched blob; True if it verified."""
        syncer = self.syncer
        known = known_version(conn, blob.memory_id)
        same = (
            known is not None
            and known.vector_clock == blob.vector_clock
            and known.device_id == blob.device_id
        )
        if not same:
            self.sync_report.pulled += 1
            applied_before = self.sync_report.applied
            verified = syncer._apply_blob(conn, blob, self.sync_report, ceiling=ceiling)
            self.result.fetched += self.sync_report.applied - applied_before
            if verified:
                syncer.state.forget_skipped(blob.memory_id, blob.device_id, blob.vector_clock)
            return verified
        if (
            blob.deleted
            or local_state(conn, blob.memory_id).exists
            or blob.vault_id != (syncer.vault_id)
        ):
            self._unresolved(blob.memory_id)
            return False
        try:
            decoded = decode_plaintext(syncer.cipher.open(blob), expected_id=blob.memory_id)
        except FormatError as exc:
            syncer._skip(blob, f"{type(exc).__name__}: {exc}", self.sync_report)
            return False
        if not isinstance(decoded, MemoryPlaintext):
            self._unresolved(blob.memory_id)
            return True
        apply_memory(conn, decoded, new=True)  # the version this device knew: written back
        self.result.restored += 1
        return True
