"""Re-key a vault on this device (PROTOCOL §19, docs/rekey.md "Client").

A re-key moves the linked vault to new keys and a new vault id, then retires the old one:

1. pull the old vault to head (a full sync on a fresh start, so this device holds
   everything and its own edits are in the old vault too; a pull on a resume);
2. re-encrypt every version this device holds (client._vault.held_versions: every live
   memory and tombstone) with the new keys, keeping memory_id, device_id, vector_clock and
   created_at (so LWW and the §18 digest carry over), padded (§16), and push them in
   batches to the new vault; what the new vault already holds is found from its digest
   (§18: the vault digest, the bucket digests, the lists of the buckets that differ) and
   not sent again;
3. check that the new vault's digest equals the digest of the held set;
4. retire the old vault with the new one as successor (`POST /v1/vaults/{old}/retire`),
   then pull the old vault once more and copy (and check) what reached it meanwhile;
5. switch the sync config and state to the new vault (its cursor from the check, the
   known clocks kept) and, for a passphrase vault, rekey engrams.db to the new passphrase.

Resumable: `rekey_state.json` (0600) in the vault directory records the step and the new
vault; the new K is kept in the encrypted database (`sync_vault_key`) before anything is
pushed, and a minted API key in the state file (as config.json keeps the API key).
Killed anywhere, running the re-key again finishes it: a passphrase re-key must be given
the same new passphrase again (its vault id must be the recorded one).

The relay is untrusted: the new vault's digest answers only decide what is pushed again
(never what is deleted), and a new vault that already holds blobs under which the new keys
verify none is refused.
"""

from __future__ import annotations

import contextlib
import logging
import os
import secrets
import signal
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Final

from engram_sync.shared_format.b64 import Base64Error, b64decode_std
from engram_sync.shared_format.blob import BlobCipher
from engram_sync.shared_format.digest import (
    BUCKETS,
    MAX_FETCH_IDS,
    PREFIX_BYTES,
    Version,
    digest_bytes,
    digest_text,
    fold,
)
from engram_sync.shared_format.errors import FormatError
from engram_sync.shared_format.padding import pad_plaintext
from engram_sync.shared_format.plaintext import (
    MemoryPlaintext,
    decode_plaintext,
    encode_memory,
    tombstone_plaintext,
)
from engram_sync.shared_format.successor_statement import make_statement
from engram_sync.shared_format.sync_keys import SyncKeys, derive_sync_keys, vault_id_v2
from engram_sync.shared_format.timestamps import utc_now_rfc3339
from engram_sync.shared_format.vault import sqlcipher
from engram_sync.shared_format.vault.salt import vault_salt16
from engram_sync.shared_format.vault.sqlcipher_key import passphrase_vault_key
from engram_sync.shared_format.wire import PushResponse, RetireResponse, SyncBlob

from .._atomic import read_json, write_json_atomic
from .._errors import ForbiddenError, RelayError, SyncError
from .._http.relay_client import RelayClient
from .._session import VaultSession
from .._sync.config import SyncConfig, save_sync_config
from .._sync.lock import sync_lock
from .._sync.reports import SyncReport
from .._vault.held_versions import by_bucket, held_versions
from .._vault.privacy import (
    forget_kept_local_clocks,
    kept_local_ids,
    without_local_links,
)
from .._vault.store import (
    memories_of_rows,
    row_needs_push,
    rows_of,
)
from .._vault.vault_key_store import (
    forget_vault_key,
    key_source,
    keys_open_relay_blobs,
    pack_keys,
    store_vault_key,
    stored_vault_key,
)

log = logging.getLogger(__name__)

STATE_FILE: Final = "rekey_state.json"
RETIRE_FEATURE: Final = "retire"
PUSH_BATCH: Final = 500  # PROTOCOL §8
# pushes of the copy in flight at once (docs/rekey.md "Measured": the relay commits them in
# group commits while this device seals the next batches)
PUSH_CONCURRENCY: Final = 4
MAX_LIST_PAGES: Final = 1000
# Test hook (tests/e2e/test_rekey_cli.py): `batch:N` or `step:NAME` makes the process kill
# itself (SIGKILL) after N pushed batches or after the named step, to prove the resume.
KILL_ENV: Final = "ENGRAM_REKEY_TEST_KILL"
STEPS: Final = ("copy", "retired", "switched")


class RekeyError(SyncError):
    """A re-key cannot go on; the message says why and what to do."""


@dataclass
class RekeyRecord:
    """`rekey_state.json`: which re-key is under way and how far it got."""

    step: str  # STEPS
    kind: str  # "passphrase" (a new passphrase) or "random" (a new random K)
    server_url: str
    old_vault_id: str
    new_vault_id: str
    old_api_key: str
    new_api_key: str
    started_at: str
    retired_at: str | None = None

    @classmethod
    def load(cls, vault_dir: Path) -> RekeyRecord | None:
        path = vault_dir / STATE_FILE
        if not path.exists():
            return None
        data = read_json(path)
        if not isinstance(data, dict) or data.get("step") not in STEPS:
            raise RekeyError(f"{path} is not a re-key record; remove it only if no re-key runs")
        names = set(cls.__dataclass_fields__)
        return cls(**{k: v for k, v in data.items() if k in names})

    def save(self, vault_dir: Path) -> None:
        write_json_atomic(vault_dir / STATE_FILE, asdict(self))


@dataclass
class RekeyReport:
    """What a re-key did (`rekey --json`)."""

    old_vault_id: str = ""
    new_vault_id: str = ""
    kind: str = ""
    resumed: bool = False
    held: int = 0  # versions this device holds (live memories and tombstones)
    live: int = 0
    tombstones: int = 0
    pushed: int = 0  # re-encrypted versions sent to the new vault by this run
    already_there: int = 0  # versions the new vault held already (a resumed run)
    rejected: int = 0  # of those, refused by the new vault (it held them or newer)
    batches: int = 0
    caught_up: int = 0  # versions that reached the old vault during the re-key, copied after
    digest: str = ""
    retired_at: str | None = None
    erase_after: str | None = None
    # from the retire's answer to the switch of this device (seconds)
    write_refused_s: float | None = None
    db_rekeyed: bool = False
    copy_seconds: float = 0.0
    steps: list[str] = field(default_factory=list)


#: Called with (versions done, versions in total) while step 2 pushes.
RekeyProgress = Callable[[int, int], None]


def _kill_point(point: str) -> None:
    """The test hook: SIGKILL this process at `point` when KILL_ENV names it."""
    wanted = os.environ.get(KILL_ENV)
    if wanted and wanted == point:
        log.warning("%s=%s: killing this process", KILL_ENV, point)
        os.kill(os.getpid(), signal.SIGKILL)


def pending_record(vault_dir: Path) -> RekeyRecord | None:
    """The re-key under way in this vault directory, if any."""
    return RekeyRecord.load(vault_dir)


@dataclass
class NewKeys:
    """The new vault: its id and keys (PROTOCOL §2 from a passphrase, or a random K)."""

    vault_id: str
    keys: SyncKeys
    passphrase: str | None


def passphrase_keys(passphrase: str) -> NewKeys:
    """PROTOCOL §2: the keys and the v2 vault id of a new passphrase (one Argon2 each)."""
    return NewKeys(vault_id_v2(passphrase), derive_sync_keys(passphrase), passphrase)


def random_keys() -> NewKeys:
    """A new random K (PROTOCOL §13) and a new random vault id (64 hex characters)."""
    return NewKeys(
        secrets.token_hex(32),
        SyncKeys(enc_key=secrets.token_bytes(32), hmac_key=secrets.token_bytes(32)),
        None,
    )


class Rekey:
    """One re-key of one open vault session (see the module docstring)."""

    def __init__(
        self,
        session: VaultSession,
        *,
        progress: RekeyProgress | None = None,
        push_batch: int = PUSH_BATCH,
        push_concurrency: int = PUSH_CONCURRENCY,
        relay_options: dict[str, object] | None = None,
    ) -> None:
        self.session = session
        self.progress = progress or (lambda done, total: None)
        self.push_batch = push_batch
        self.push_concurrency = max(1, push_concurrency)
        self._copied = 0  # versions of the current copy answered so far
        self.relay_options = relay_options or {}
        self.report = RekeyReport()
        self._batches = 0

    # -- what kind of re-key ----------------------------------------------------------------

    def kind(self) -> str:
        """`passphrase` when this device's sync keys come from the vault passphrase, else
        `random` (a K from the account or a team handoff: the new K is random too)."""
        record = RekeyRecord.load(self.session.path)
        if record is not None:
            return record.kind
        source = key_source(self.session.vault.conn, self.session.config.vault_id)
        return "passphrase" if source == "passphrase" else "random"

    # -- the whole run ------------------------------------------------------------------------

    # long: the re-key's phases in their order (docs/rekey.md), each resumable; the phases are
    #   helpers
    def run(
        self,
        *,
        new_passphrase: str | None,
        new_api_key: str | None,
        mint_key: Callable[[str, bytes], str] | None = None,
    ) -> RekeyReport:
        """Start or resume the re-key.

        `new_passphrase`: required for a passphrase vault (ignored otherwise).
        `new_api_key`: the key for the new vault; None keeps the current key (an operator
        key that reaches every vault) unless `mint_key` is given: `mint_key(new_vault_id,
        K)` stores K's wrap in the account and returns a key minted for the new vault.
        """
        session = self.session
        path = session.path
        record = RekeyRecord.load(path)
        report = self.report
        if record is None:
            record, new = self._start(new_passphrase, new_api_key, mint_key)
        else:
            report.resumed = True
            new = self._resume_keys(record, new_passphrase)
            if not record.new_api_key:  # stopped between the record and the mint
                self._mint_pending(record, new, mint_key)
        report.old_vault_id, report.new_vault_id = record.old_vault_id, record.new_vault_id
        report.kind = record.kind
        old_relay = self._relay(record.old_api_key)
        new_relay = self._relay(record.new_api_key)
        with old_relay, new_relay:
            checked: tuple[tuple[int, float, int], int] | None = None
            # the window from the retire to the switch: no other sync of this device runs
            # in it (client._sync.lock), so only the pull below can change the held set
            with contextlib.ExitStack() as window:
                if record.step == "copy":
                    self._require_retire(old_relay)
                    if report.resumed:
                        self._pull_old(old_relay)
                    self._check_new_vault_keys(new_relay, record.new_vault_id, new.keys)
                    started = time.monotonic()
                    self._copy(new_relay, record.new_vault_id, new.keys)
                    report.copy_seconds = time.monotonic() - started
                    _kill_point("step:copied")
                    window.enter_context(sync_lock(path))
                    cursor = self._check(new_relay, record.new_vault_id)
                    checked = (self._fingerprint(), cursor)
                    _kill_point("step:checked")
                    answer = self._retire(record)
                    refused_from = time.monotonic()
                    record.step, record.retired_at = "retired", answer.retired_at
                    report.retired_at, report.erase_after = answer.retired_at, answer.erase_after
                    record.save(path)
                    report.steps.append("retired")
                    _kill_point("step:retired")
                else:
                    refused_from = time.monotonic()
                    report.retired_at = record.retired_at
                if record.step == "retired":
                    if checked is None:
                        window.enter_context(sync_lock(path))
                    cursor = self._catch_up(old_relay, new_relay, record, new, checked)
                    self._switch(record, new, cursor)
                    report.write_refused_s = time.monotonic() - refused_from
                    _kill_point("step:switched")
        self._finish(record, new)
        return report

    def _catch_up(
        self,
        old_relay: RelayClient,
        new_relay: RelayClient,
        record: RekeyRecord,
        new: NewKeys,
        checked: tuple[tuple[int, float, int], int] | None,
    ) -> int:
        """After the retire: pull the old vault once more; what reached it before the retire
        is copied and checked. When the pull changed nothing this device holds (the known
        versions' fingerprint is the one of the check before the retire), that check stands
        and its cursor is the new vault's. Returns the new vault's cursor."""
        before = self.report.pushed
        self._pull_old(old_relay)
        if checked is not None and self._fingerprint() == checked[0]:
            return checked[1]
        self._copy(new_relay, record.new_vault_id, new.keys)
        self.report.caught_up = self.report.pushed - before
        return self._check(new_relay, record.new_vault_id)

    def _fingerprint(self) -> tuple[int, float, int]:
        """(count, total, highest) of the known clocks: any pulled or pushed version changes
        it (a new version always has a higher clock than the one it replaces)."""
        row = self.session.vault.conn.execute(
            "SELECT count(*), total(vector_clock), coalesce(max(vector_clock), 0)"
            " FROM sync_known_clocks"
        ).fetchone()
        return int(row[0]), float(row[1]), int(row[2])

    # -- start and resume ---------------------------------------------------------------------

    def _start(
        self,
        new_passphrase: str | None,
        new_api_key: str | None,
        mint_key: Callable[[str, bytes], str] | None,
    ) -> tuple[RekeyRecord, NewKeys]:
        session = self.session
        config = session.config
        if not config.vault_id or not config.server_url or not config.api_key:
            raise RekeyError(
                "this vault is not linked to a relay: there is nothing to re-key "
                "(`engram-sync link` first)"
            )
        kind = self.kind()
        if kind == "passphrase":
            if not new_passphrase:
                raise RekeyError("a passphrase vault is re-keyed to a new passphrase: give one")
            if new_passphrase == session.passphrase:
                raise RekeyError("the new passphrase is the current one: choose another")
            new = passphrase_keys(new_passphrase)
        else:
            new = random_keys()
        if new.vault_id == config.vault_id:
            raise RekeyError("the new keys give the current vault id: choose another passphrase")
        with self._relay(config.api_key) as old_relay:
            self._require_retire(old_relay)
            # step 1: everything this device and the old vault hold, in both places
            session.syncer(old_relay).sync()
        self.report.steps.append("pulled")
        _kill_point("step:pulled")
        k = pack_keys(new.keys, new.vault_id)
        with session.vault.transaction() as conn:
            # the new K before anything is pushed under it (client._vault.vault_key_store): a random
            # K exists nowhere else until the account holds its wrap
            store_vault_key(conn, k, "passphrase" if kind == "passphrase" else "account")
        # The record before any key is minted: a run killed after the mint (the account
        # holds K's wrap) finds it and mints again with the same stored K (`_mint_pending`)
        # instead of starting over with another K and leaving a vault behind. An empty
        # new_api_key is "to be minted".
        record = RekeyRecord(
            step="copy",
            kind=kind,
            server_url=config.server_url,
            old_vault_id=config.vault_id,
            new_vault_id=new.vault_id,
            old_api_key=config.api_key,
            new_api_key=new_api_key or ("" if mint_key is not None else config.api_key),
            started_at=_now(),
        )
        record.save(session.path)
        _kill_point("step:key-stored")
        self._mint_pending(record, new, mint_key)
        _kill_point("step:started")
        return record, new

    def _mint_pending(
        self, record: RekeyRecord, new: NewKeys, mint_key: Callable[[str, bytes], str] | None
    ) -> None:
        """Mint the new vault's key if the record says it is still to be minted (PROTOCOL
        §13: K's wrap into the account, then a key; both again on a resume, with the same
        K), and label this device in the new vault."""
        session = self.session
        if not record.new_api_key:
            if mint_key is None:
                raise RekeyError(
                    f"the re-key to vault {record.new_vault_id} stopped before its key was "
                    "minted: run `engram-sync rekey` again with the account's password"
                )
            record.new_api_key = mint_key(record.new_vault_id, pack_keys(new.keys, new.vault_id))
            record.save(session.path)
            _kill_point("step:minted")
        with self._relay(record.new_api_key) as new_relay:
            new_relay.register_device(
                record.new_vault_id, session.device.device_id, session.device.label
            )

    def _resume_keys(self, record: RekeyRecord, new_passphrase: str | None) -> NewKeys:
        conn = self.session.vault.conn
        stored = stored_vault_key(conn, record.new_vault_id)
        if record.kind == "passphrase":
            if not new_passphrase:
                raise RekeyError(
                    f"a re-key to vault {record.new_vault_id} is under way: give the same new "
                    "passphrase again to finish it"
                )
            if vault_id_v2(new_passphrase) != record.new_vault_id:
                raise RekeyError(
                    f"this new passphrase gives another vault id than the re-key under way "
                    f"({record.new_vault_id}): give the new passphrase of that re-key"
                )
            keys = (
                SyncKeys(enc_key=stored.enc_key, hmac_key=stored.hmac_key)
                if stored is not None
                else derive_sync_keys(new_passphrase)
            )
            return NewKeys(record.new_vault_id, keys, new_passphrase)
        if stored is None:
            raise RekeyError(
                f"the key of the new vault {record.new_vault_id} is not on this device: this "
                f"re-key cannot be finished; remove {self.session.path / STATE_FILE} and run "
                "`engram-sync rekey` again (the old vault is not retired yet)"
            )
        return NewKeys(
            record.new_vault_id, SyncKeys(enc_key=stored.enc_key, hmac_key=stored.hmac_key), None
        )

    # -- relay helpers ------------------------------------------------------------------------

    def _relay(self, api_key: str) -> RelayClient:
        config = self.session.config
        assert config.server_url is not None
        return RelayClient(
            config.server_url,
            api_key,
            device_id=self.session.device.device_id,
            **self.relay_options,  # type: ignore[arg-type]
        )

    def _require_retire(self, relay: RelayClient) -> None:
        if not relay.offers(RETIRE_FEATURE):
            raise RekeyError(
                f"the relay at {relay.base_url} does not offer vault retirement (PROTOCOL §19, "
                "`retire` in /v1/info): upgrade the relay before re-keying"
            )

    def _pull_old(self, old_relay: RelayClient) -> None:
        """Step 1 on a resume: pull the old vault to head (it may be retired: pulls work)."""
        session = self.session
        syncer = session.syncer(old_relay, check_digest=False)
        syncer.pull(SyncReport())
        self.report.steps.append("pulled")

    def _check_new_vault_keys(self, relay: RelayClient, vault_id: str, keys: SyncKeys) -> None:
        """PROTOCOL §14 defence in depth: a new vault already holding blobs of which none
        verifies under the new keys is someone else's vault (or a relay's forgery)."""
        if keys_open_relay_blobs(relay, vault_id, keys) is False:
            raise RekeyError(
                f"the new vault {vault_id} on the relay already holds blobs that do not verify "
                "under the new keys: refusing to re-key into it (another vault with this id? "
                "choose another passphrase, or tell the relay's operator)"
            )

    # -- step 2: copy -------------------------------------------------------------------------

    def _held(self) -> list[Version]:
        """The versions a re-key copies: every held version but the live ones of memories
        kept local (PROTOCOL §8: strict_local is never sealed; docs/privacy.md)."""
        conn = self.session.vault.conn
        kept = kept_local_ids(conn)
        return [v for v in held_versions(conn) if v.deleted or v.memory_id not in kept]

    def _copy(self, relay: RelayClient, vault_id: str, keys: SyncKeys) -> None:
        held = self._held()
        report = self.report
        report.held = len(held)
        report.tombstones = sum(1 for v in held if v.deleted)
        report.live = report.held - report.tombstones
        missing = self._missing_on(relay, vault_id, held)
        report.already_there = len(held) - len(missing)
        missing.sort(key=lambda v: v.memory_id)
        self._copied = 0
        cipher = BlobCipher(keys)
        limit = self._batch_limit(relay)
        total = len(missing)
        self.progress(0, total)
        # Pipelined: this thread reads and seals the next batches (the database connection
        # is this thread's) while up to `push_concurrency` pushes wait for the relay. Each
        # version is in one batch and keeps its clock, so the order in which the batches
        # commit does not matter; a kill leaves whole batches, and the rerun's digest finds
        # what is missing.
        in_flight: deque[tuple[int, Future[PushResponse]]] = deque()
        pool = ThreadPoolExecutor(self.push_concurrency, thread_name_prefix="rekey-push")
        try:
            for start in range(0, total, limit):
                batch = missing[start : start + limit]
                blobs = self._seal(cipher, vault_id, batch)
                in_flight.append((len(batch), pool.submit(relay.push, vault_id, blobs)))
                if len(in_flight) >= self.push_concurrency:
                    self._pushed(*in_flight.popleft(), total)
            while in_flight:
                self._pushed(*in_flight.popleft(), total)
        finally:
            pool.shutdown(wait=True, cancel_futures=True)
        report.steps.append("copied")

    def _pushed(self, size: int, push: Future[PushResponse], total: int) -> None:
        """One batch's push answered (its error raised here)."""
        answer = push.result()
        report = self.report
        report.rejected += len(answer.rejected)  # held already (a lost answer) or newer
        report.pushed += size
        report.batches += 1
        self._batches += 1
        self._copied += size
        self.progress(self._copied, total)
        _kill_point(f"batch:{self._batches}")

    def _batch_limit(self, relay: RelayClient) -> int:
        try:
            return max(1, min(self.push_batch, relay.info().max_blobs_per_push))
        except SyncError:
            return self.push_batch

    def _missing_on(self, relay: RelayClient, vault_id: str, held: list[Version]) -> list[Version]:
        """The held versions the vault lacks (exactly: same clock and device), from its
        digest: the vault digest; on a mismatch the bucket digests; the lists of the buckets
        that differ (PROTOCOL §18). Only decides what is pushed; nothing is deleted."""
        top = relay.digest(vault_id)
        value, count = fold(held)
        if top.digest == digest_text(value) and top.count == count:
            return []
        if top.count == 0:
            return list(held)
        every = relay.digest(vault_id, every_bucket=True)
        try:
            prefixes = b64decode_std(every.buckets) if isinstance(every.buckets, str) else b""
        except Base64Error:
            prefixes = b""
        counts = every.counts if isinstance(every.counts, list) else []
        usable = len(prefixes) == BUCKETS * PREFIX_BYTES and len(counts) == BUCKETS
        missing: list[Version] = []
        for bucket, versions in by_bucket(held).items():
            if usable:
                digest, size = fold(versions)
                theirs = prefixes[bucket * PREFIX_BYTES : (bucket + 1) * PREFIX_BYTES]
                if digest_bytes(digest)[:PREFIX_BYTES] == theirs and size == counts[bucket]:
                    continue
                if counts[bucket] == 0:
                    missing.extend(versions)
                    continue
            there = self._bucket_list(relay, vault_id, bucket)
            missing.extend(v for v in versions if there.get(v.memory_id) != v)
        return missing

    def _bucket_list(self, relay: RelayClient, vault_id: str, bucket: int) -> dict[str, Version]:
        versions: dict[str, Version] = {}
        after = ""
        for _ in range(MAX_LIST_PAGES):
            page = relay.digest(vault_id, bucket=bucket, entries=True, after=after)
            entries = page.entries if isinstance(page.entries, list) else []
            for e in entries:
                after = max(after, e.memory_id)
                versions[e.memory_id] = Version(e.memory_id, e.device_id, e.vector_clock, e.deleted)
            if page.has_more is not True or not entries:
                return versions
        return versions  # a list that never ends: the rest counts as missing (pushed again)

    def _seal(self, cipher: BlobCipher, vault_id: str, batch: list[Version]) -> list[SyncBlob]:
        """The versions re-encrypted: same memory_id, device_id, clock, deleted, created_at
        (the created_at this device knows for the version), padded (PROTOCOL §16)."""
        conn = self.session.vault.conn
        stamps = dict(
            conn.execute(
                "SELECT memory_id, created_at FROM sync_known_clocks WHERE memory_id IN"  # noqa: S608
                f" ({', '.join('?' * len(batch))})",  # placeholders only
                [v.memory_id for v in batch],
            ).fetchall()
        )
        texts = self._plaintexts(batch)
        return [
            cipher.seal(
                pad_plaintext(texts[v.memory_id]),
                vault_id=vault_id,
                memory_id=v.memory_id,
                device_id=v.device_id,
                vector_clock=v.vector_clock,
                deleted=v.deleted,
                created_at=stamps.get(v.memory_id),
            )
            for v in batch
        ]

    def _plaintexts(self, batch: list[Version]) -> dict[str, str]:
        """memory id -> the plaintext of the held version: a tombstone's, the row's when the
        row is that version (no local edit since), else the old vault's blob of it."""
        conn = self.session.vault.conn
        texts: dict[str, str] = {}
        from_old: list[Version] = []
        rows = rows_of(conn, [v.memory_id for v in batch if not v.deleted])
        current = []
        for v in batch:
            if v.deleted:
                texts[v.memory_id] = tombstone_plaintext(v.memory_id)
                continue
            row = rows.get(v.memory_id)
            if row is None or row_needs_push(row):
                from_old.append(v)  # edited or deleted here since: the version is elsewhere
                continue
            current.append(row)
        for memory in memories_of_rows(conn, current):
            texts[memory.id] = encode_memory(without_local_links(conn, memory))
        if from_old:
            texts.update(self._old_plaintexts(from_old))
        return texts

    def _old_plaintexts(self, versions: list[Version]) -> dict[str, str]:
        """The plaintexts of these versions from the old vault's blobs (verified under the
        old keys, exactly these versions); RekeyError when the old vault lacks one."""
        record = RekeyRecord.load(self.session.path)
        assert record is not None
        wanted = {v.memory_id: v for v in versions}
        old_cipher = BlobCipher(self._old_keys(record))
        found: dict[str, str] = {}
        with self._relay(record.old_api_key) as old:
            ids = sorted(wanted)
            for start in range(0, len(ids), MAX_FETCH_IDS):
                answer = old.fetch(record.old_vault_id, ids[start : start + MAX_FETCH_IDS])
                for blob in answer.blobs:
                    v = wanted.get(blob.memory_id)
                    if v is None or (blob.device_id, blob.vector_clock) != (
                        v.device_id,
                        v.vector_clock,
                    ):
                        continue
                    try:
                        text = old_cipher.open(blob)
                        decoded = decode_plaintext(text, expected_id=blob.memory_id)
                    except FormatError:
                        continue
                    if isinstance(decoded, MemoryPlaintext):
                        found[blob.memory_id] = encode_memory(decoded)
        lacking = sorted(set(wanted) - set(found))
        if lacking:
            raise RekeyError(
                f"{len(lacking)} version(s) this device holds are neither in its database (edited "
                f"since) nor verifiable in the old vault (e.g. {lacking[0]}): run "
                "`engram-sync sync`, then `engram-sync rekey` again"
            )
        return found

    def _old_keys(self, record: RekeyRecord) -> SyncKeys:
        """The old vault's keys: the session's, which stay the old vault's until the switch."""
        if self.session.config.vault_id != record.old_vault_id:
            raise RekeyError("the old vault's keys are gone: this device switched already")
        return self.session.keys

    # -- step 3: check ------------------------------------------------------------------------

    def _check(self, relay: RelayClient, vault_id: str) -> int:
        """The new vault's digest equals the held set's (PROTOCOL §18); its cursor."""
        held = self._held()
        value, count = fold(held)
        top = relay.digest(vault_id)
        if top.digest != digest_text(value) or top.count != count:
            missing = self._missing_on(relay, vault_id, held)
            raise RekeyError(
                f"the new vault {vault_id} does not hold what this device holds after the copy "
                f"(relay: {top.count} version(s), this device: {count}; {len(missing)} "
                "missing or different): nothing was retired; run `engram-sync rekey` again"
            )
        self.report.digest = top.digest
        self.report.steps.append("checked")
        return top.cursor

    # -- step 4: retire -----------------------------------------------------------------------

    def _retire(self, record: RekeyRecord) -> RetireResponse:
        """PROTOCOL §19 with the device's current key for the old vault (the person may have
        linked it again with an admin key after a refusal), else the recorded one."""
        old, new = record.old_vault_id, record.new_vault_id
        config = self.session.config
        key = config.api_key if config.vault_id == old and config.api_key else record.old_api_key
        with self._relay(key) as relay:
            return self._post_retire(relay, old, new, self._old_keys(record))

    def _post_retire(
        self, relay: RelayClient, old: str, new: str, old_keys: SyncKeys
    ) -> RetireResponse:
        # PROTOCOL §19 last bullet: the successor statement, under the OLD vault's hmac key,
        # so that the other devices follow `new` only on the word of a holder of the old keys
        stated_at = utc_now_rfc3339()
        statement = make_statement(old_keys.hmac_key, old, new, stated_at)
        try:
            answer = relay.retire(old, new, statement=statement, stated_at=stated_at)
        except ForbiddenError as exc:
            if exc.code == "owner_only":  # PROTOCOL §13: only the owner retires
                raise RekeyError(
                    f"the relay refused to retire vault {old} (owner_only): only its owner may "
                    f"retire it, and this device's key is an admin grant's. The new vault {new} "
                    "holds everything; link this device with an owner's admin key (`engram-sync "
                    f"link --relay {relay.base_url} --api-key ADMIN_KEY --vault-id {old}`), or "
                    "ask the owner to, then run `engram-sync rekey` again to finish"
                ) from None
            raise RekeyError(
                f"the relay refused to retire vault {old} ({exc.code}): the API key of this "
                "device is not an admin key for it (and for the new vault). The new vault "
                f"{new} holds everything; link this device with an admin key (`engram-sync "
                f"link --relay {relay.base_url} --api-key ADMIN_KEY --vault-id {old}`), or ask "
                "an admin to, then run `engram-sync rekey` again to finish"
            ) from None
        except RelayError as exc:
            if exc.code == "already_retired":
                raise RekeyError(
                    f"vault {old} was already retired with another successor: another re-key "
                    f"finished first; this one (to {new}) stops here. Link this device to the "
                    "successor the other re-key made"
                ) from None
            raise
        if answer.successor != new:
            raise RekeyError(
                f"the relay says vault {old} was retired with successor {answer.successor!r}, "
                f"not {new}: nothing was switched; check with the relay's operator"
            )
        return answer

    # -- step 5: switch -----------------------------------------------------------------------

    def _switch(self, record: RekeyRecord, new: NewKeys, cursor: int) -> None:
        """Config and sync state to the new vault: cursor from its check (it holds exactly
        what this device holds), generation and known clocks kept."""
        session = self.session
        state = session.state
        generation = state.generation
        session.config = SyncConfig(
            enabled=True,
            server_url=record.server_url,
            api_key=record.new_api_key,
            vault_id=record.new_vault_id,
            interval_secs=session.config.interval_secs,
        )
        state.bind(record.server_url, record.new_vault_id)
        state.cursor, state.generation = cursor, generation
        if hasattr(state, "link_pull"):  # issue 17: nothing to queue, the check proved it
            setattr(state, "link_pull", False)  # noqa: B010
        state.last_error = None
        state.save()
        with session.vault.transaction() as conn:  # the new vault holds none of them
            forget_kept_local_clocks(conn)
        save_sync_config(session.path, session.config)
        session.set_keys(new.keys)  # the cached keys follow the switch
        record.step = "switched"
        record.save(session.path)
        self.report.steps.append("switched")

    def _finish(self, record: RekeyRecord, new: NewKeys) -> None:
        """After the switch: rekey engrams.db (a passphrase vault), forget the old K, and
        remove the record (a later re-key starts afresh)."""
        session = self.session
        conn = session.vault.conn
        if record.kind == "passphrase" and new.passphrase is not None:
            if session.passphrase != new.passphrase:
                key = passphrase_vault_key(new.passphrase, vault_salt16(session.path))
                sqlcipher.rekey(conn, key)  # VAULT §2
                session.passphrase = new.passphrase
                self.report.db_rekeyed = True
            _kill_point("step:db_rekeyed")
        with session.vault.transaction() as tx:
            forget_vault_key(tx, record.old_vault_id)
        (session.path / STATE_FILE).unlink(missing_ok=True)
        self.report.steps.append("done")


def account_minter(session: VaultSession, password: str) -> Callable[[str, bytes], str]:
    """For `Rekey.run(mint_key=...)`: PROTOCOL §13, K of the new vault wrapped under the
    account key A (`PUT /account/vaults/{new}/wrap`, so the person's other devices get it with
    `engram-sync link --account`), then a key for the new vault minted through the account
    (`POST /account/keys`): admin, and not bound to one device, since the copy pushes the
    versions of every device under their own device ids (PROTOCOL §10)."""
    from engram_sync.shared_format.b64 import b64encode_std
    from engram_sync.shared_format.wraps import wrap_vault_key

    from .._accounts import account as account_ops

    def mint(vault_id: str, k: bytes) -> str:
        unlocked = account_ops.unlock(session.path, password)
        wrapped = b64encode_std(wrap_vault_key(k, unlocked.account_key))
        with unlocked.client() as relay:
            relay.put_vault_wrap(vault_id, wrapped, unlocked.secret)
            label = f"{session.device.label} (re-key)"
            return relay.mint_key(vault_id, device_id=None, label=label, admin=True).key

    return mint


def _now() -> str:
    from engram_sync.shared_format.timestamps import utc_now_rfc3339

    return utc_now_rfc3339()
