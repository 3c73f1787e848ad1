"""Convergence under random histories (issue 8 §2): a hypothesis state machine over three
devices and one real relay. Random adds, edits, deletes, syncs, offline periods, restarts
and dropped connections (before a push, or after the relay committed it); then every
device syncs until quiet. Checked:

- after every successful sync of a device, each of its local changes made since its last
  sync was either accepted by the relay or kept in its `sync_conflicts`;
- at the end all devices hold identical memories, a fourth one too (`delta`): it never
  syncs by itself but runs the live loop of `engram-sync watch` (client._flows.live) with a
  timer that never fires, so the relay's event stream alone brings it every change, and the
  memories the test writes into its vault through a second connection (as another program
  would) reach the others only because its watch noticed them (PROTOCOL §15, issue 15).

CI runs a few examples (fewer in the `[citus]` case); `--full` runs 500.
"""

from __future__ import annotations

import itertools
import json
import os
import shutil
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from engram_sync.client._errors import RelayUnavailableError
from engram_sync.client._http.relay_client import RelayClient
from engram_sync.client._session import VaultSession
from engram_sync.client._vault import store as local_store
from engram_sync.client._vault.held_versions import held_versions
from engram_sync.relay.store.bucket_prefixes import count_list
from engram_sync.shared_format.blob import BlobCipher
from engram_sync.shared_format.digest import digest_int, fold
from engram_sync.shared_format.plaintext import Tombstone, decode_plaintext
from engram_sync.shared_format.sync_keys import SyncKeys, derive_sync_keys
from engram_sync.shared_format.wire import PushResponse, SyncBlob
from tests import tiers
from tests.conftest import backend_of, takes_backend
from tests.e2e.conftest import PASSPHRASE
from tests.e2e.live_support import NEVER, Watcher, wait_for
from tests.relay.bucket_oracle import versions_buckets
from tests.relay.conftest import ADMIN_KEY, Relay, RelayThread, base_config
from tests.relay.support import migrated_backend_database

#: The same tests on the Citus cluster too, by default (issue 18, tests/conftest.py).
pytestmark = pytest.mark.both_databases

FULL = tiers.full()  # --full: the full sizes (tests/tiers.py)
DEVICES = ("alpha", "bravo", "charlie")
_vault_numbers = itertools.count()


class DropsConnection(RelayClient):
    """A relay client whose next push fails: before sending, or after the relay committed."""

    mode: str = "none"

    def push(self, vault_id: str, blobs: list[SyncBlob]) -> PushResponse:
        if self.mode == "before":
            raise RelayUnavailableError("dropped before the push (simulated)", url=self.base_url)
        response = super().push(vault_id, blobs)
        if self.mode == "after":
            raise RelayUnavailableError("dropped after the push (simulated)", url=self.base_url)
        return response


class World:
    """Shared across examples: one relay, one template vault, the derived keys."""

    relay: Relay
    template: Path
    keys: SyncKeys
    root: Path


@pytest.fixture(scope="module")
@takes_backend
def world(request: pytest.FixtureRequest, postgres_url: str) -> Iterator[World]:
    """One relay on its own database for the whole module (plain PostgreSQL, and the
    Citus cluster for the `[citus]` case: tests/conftest.py); each example uses a new
    vault id."""
    with migrated_backend_database(request, postgres_url) as database_url:
        yield from _world_on(database_url)


def _world_on(database_url: str) -> Iterator[World]:
    config = base_config(database_url)
    server = RelayThread(config).start()
    w = World()
    w.relay = Relay(server.url, database_url, config)
    w.root = Path(tempfile.mkdtemp(prefix="engram-convergence-"))
    w.template = w.root / "template"
    with VaultSession.open(w.template, PASSPHRASE, create=True):
        pass
    (w.template / "device.json").unlink()
    w.keys = derive_sync_keys(PASSPHRASE)
    try:
        yield w
    finally:
        server.stop()
        shutil.rmtree(w.root, ignore_errors=True)


class Device:
    def __init__(self, world: World, vault_id: str, name: str) -> None:
        self.world = world
        self.path = world.root / vault_id / name
        shutil.copytree(world.template, self.path)
        self.session = self._open()
        self.session.link(world.relay.url, ADMIN_KEY, vault_id, name)
        self.client = DropsConnection(world.relay.url, ADMIN_KEY, max_retries=0)
        self.pending: dict[str, str | None] = {}  # memory id -> local text (None = deleted)

    def _open(self) -> VaultSession:
        session = VaultSession.open(self.path, PASSPHRASE)
        session._keys = self.world.keys  # the same passphrase derives the same keys
        return session

    def restart(self) -> None:
        self.session.close()
        self.session = self._open()

    def contents(self) -> dict[str, str]:
        conn = self.session.vault.conn
        return {m.id: m.content for m in local_store.list_memories(conn)}

    def conflict_texts(self) -> set[tuple[str, str | None]]:
        rows = self.session.vault.conn.execute(
            "SELECT memory_id, local_plaintext FROM sync_conflicts"
        ).fetchall()
        kept: set[tuple[str, str | None]] = set()
        for memory_id, text in rows:
            obj = json.loads(text)
            kept.add((memory_id, None if obj.get("deleted") else obj["content"]))
        return kept

    def sync(self, drop: str = "none") -> bool:
        self.client.mode = drop
        try:
            self.session.syncer(self.client).sync()
        except RelayUnavailableError:
            return False
        finally:
            self.client.mode = "none"
        return True

    def close(self) -> None:
        self.client.close()
        self.session.close()


class FeedDevice:
    """`delta`: synced only by a live watch in a thread of its own; the test reads and
    writes its vault through a second connection, as another program would."""

    def __init__(self, world: World, vault_id: str, name: str) -> None:
        self.path = world.root / vault_id / name
        shutil.copytree(world.template, self.path)
        with VaultSession.open(self.path, PASSPHRASE) as session:
            session.link(world.relay.url, ADMIN_KEY, vault_id, name)
        self.watcher = Watcher(self.path, interval=NEVER).start()
        self.session = VaultSession.open(self.path, PASSPHRASE)
        self.pending: dict[str, str | None] = {}

    def contents(self) -> dict[str, str]:
        return {m.id: m.content for m in local_store.list_memories(self.session.vault.conn)}

    def conflict_texts(self) -> set[tuple[str, str | None]]:
        return Device.conflict_texts(self)  # type: ignore[arg-type]

    def unpushed(self) -> int:
        return sum(local_store.count_to_push(self.session.vault.conn))

    def close(self) -> None:
        self.watcher.stop()
        self.session.close()


class Convergence(RuleBasedStateMachine):
    world: World
    examples_run = 0  # EXAMPLES_RUN: counted for RELIABILITY.md

    def __init__(self) -> None:
        super().__init__()
        self.vault_id = f"conv-{os.getpid()}-{next(_vault_numbers)}"
        self.devices = [Device(self.world, self.vault_id, n) for n in DEVICES]
        self.feed = FeedDevice(self.world, self.vault_id, "delta")
        self.clocks: list[dict[str, int]] = [{} for _ in DEVICES]  # the last seen clocks
        self.texts = itertools.count()

    def teardown(self) -> None:
        Convergence.examples_run += 1
        for device in self.devices:
            device.close()
        self.feed.close()
        shutil.rmtree(self.world.root / self.vault_id, ignore_errors=True)

    def _text(self, device: Device) -> str:
        return f"{device.path.name} text {next(self.texts)}"

    @initialize()
    def start(self) -> None:
        """Begin with a few memories every device holds, so conflicts can happen at once."""
        for _ in range(3):
            self.add(0)
        for index in range(len(self.devices)):
            assert self.devices[index].sync()
            self._check_nothing_lost(self.devices[index])

    @rule(d=st.integers(0, 2))
    def add(self, d: int) -> None:
        device = self.devices[d]
        text = self._text(device)
        with device.session.vault.transaction() as conn:
            memory_id = local_store.add_memory(conn, text)
        device.pending[memory_id] = text

    @rule()
    def add_on_the_feed_device(self) -> None:
        """Another program writes into delta's engrams.db; only its watch can push it."""
        text = f"delta text {next(self.texts)}"
        with self.feed.session.vault.transaction() as conn:
            memory_id = local_store.add_memory(conn, text)
        self.feed.pending[memory_id] = text

    def _pick(self, device: Device, pick: int) -> str | None:
        held = sorted(device.contents())
        return held[pick % len(held)] if held else None

    def _edit(self, device: Device, memory_id: str) -> None:
        text = self._text(device)
        with device.session.vault.transaction() as conn:
            if local_store.edit_memory(conn, memory_id, text):
                device.pending[memory_id] = text

    @rule(d=st.integers(0, 2), pick=st.integers(0, 10**6))
    def edit(self, d: int, pick: int) -> None:
        device = self.devices[d]
        memory_id = self._pick(device, pick)
        if memory_id is not None:
            self._edit(device, memory_id)

    @rule(pair=st.sampled_from([(0, 1), (1, 2), (0, 2)]), pick=st.integers(0, 10**6))
    def edit_on_two_devices(self, pair: tuple[int, int], pick: int) -> None:
        """The same memory edited on two devices before either syncs: a real conflict."""
        first, second = (self.devices[i] for i in pair)
        memory_id = self._pick(first, pick)
        if memory_id is not None and memory_id in second.contents():
            self._edit(first, memory_id)
            self._edit(second, memory_id)

    @rule(d=st.integers(0, 2), pick=st.integers(0, 10**6))
    def delete(self, d: int, pick: int) -> None:
        device = self.devices[d]
        memory_id = self._pick(device, pick)
        if memory_id is None:
            return
        with device.session.vault.transaction() as conn:
            if local_store.delete_memory(conn, memory_id):
                device.pending[memory_id] = None

    @rule(d=st.integers(0, 2), drop=st.sampled_from(["none", "none", "none", "before", "after"]))
    def sync(self, d: int, drop: str) -> None:
        device = self.devices[d]
        if device.sync(drop):
            self._check_nothing_lost(device)
        elif drop == "after":
            self._forget_accepted(device)

    def _forget_accepted(self, device: Device) -> None:
        """After a push whose answer was lost, the device cannot tell what the relay took,
        but the relay can: pending changes it now holds (decrypted with the vault's keys)
        were accepted, so a later edit elsewhere may legitimately replace them."""
        cipher = BlobCipher(self.world.keys)
        rows = self.world.relay.sql(
            "SELECT vault_id, memory_id, device_id, vector_clock, ciphertext, hmac,"
            " created_at, deleted FROM blobs WHERE vault_id = $1 AND memory_id = ANY($2)",
            self.vault_id,
            list(device.pending),
        )
        for row in rows:
            blob = SyncBlob(**dict(row))
            if blob.device_id != device.session.device.device_id:
                continue
            decoded = decode_plaintext(cipher.open(blob), expected_id=blob.memory_id)
            held = None if isinstance(decoded, Tombstone) else decoded.content
            if device.pending.get(blob.memory_id, "<none>") == held:
                del device.pending[blob.memory_id]

    @rule(d=st.integers(0, 2))
    def restart(self, d: int) -> None:
        self.devices[d].restart()

    def _check_nothing_lost(self, device: Device | FeedDevice) -> None:
        held = device.contents()
        kept = device.conflict_texts()
        for memory_id, text in device.pending.items():
            accepted = memory_id not in held if text is None else held.get(memory_id) == text
            assert accepted or (memory_id, text) in kept, (memory_id, text, held.get(memory_id))
        device.pending.clear()

    @invariant()
    def the_feed_device_lost_nothing(self) -> None:
        """Once delta's watch has pushed what was written into its vault, each of those
        memories is there (delta only adds new memories: no other device can have changed
        them before pulling them, which takes a step, and this runs after every step)."""
        if self.feed.pending and self.feed.unpushed() == 0:
            self._check_nothing_lost(self.feed)

    @invariant()
    def clocks_never_go_backwards(self) -> None:
        """Each device's own clock, and the clock it knows for each memory, is never below
        what an earlier step saw (PROTOCOL §1), across syncs, drops and restarts. Fails
        every run (3 of 3) with `client._sync.device.Device.observe` lowering the clock to a
        remote one."""
        for device, seen in zip(self.devices, self.clocks, strict=True):
            now = dict(
                device.session.vault.conn.execute(
                    "SELECT memory_id, vector_clock FROM sync_known_clocks"
                ).fetchall()
            )
            now[""] = device.session.device.vector_clock  # "": the device's own clock
            back = {k: (seen[k], v) for k, v in now.items() if k in seen and v < seen[k]}
            assert back == {}, f"{device.path.name}: clock went from -> to {back}"
            seen.update(now)

    def converge(self) -> None:
        feed = self.feed
        wait_for(lambda: feed.unpushed() == 0, "delta's watch to push what was written")
        self._check_nothing_lost(feed)
        for _ in range(3):
            for device in self.devices:
                assert device.sync()
                self._check_nothing_lost(device)
        first = self.devices[0].contents()
        for device in self.devices[1:]:
            assert device.contents() == first
        wait_for(lambda: feed.contents() == first, "delta to follow through the feed alone")
        assert feed.watcher.error is None
        self._check_digests()

    def _check_digests(self) -> None:
        """PROTOCOL §18: at the end of every run each device's digest over the versions it
        holds equals the relay's stored digest of the vault (docs/digest.md), and its
        bucket prefixes and counts the relay's stored ones (`?buckets=1`, revision 0012)."""
        [row] = self.world.relay.sql(
            "SELECT digest, live_blobs + tombstones AS n, bucket_prefixes, bucket_counts"
            " FROM vaults WHERE vault_id = $1",
            self.vault_id,
        )
        relay_side = (digest_int(row["digest"]), row["n"])
        relay_buckets = (row["bucket_prefixes"], count_list(row["bucket_counts"]))
        for device in self.devices:
            held = held_versions(device.session.vault.conn)
            assert fold(held) == relay_side, device.path.name
            assert versions_buckets(held) == relay_buckets, device.path.name


#: CI size per backend (`--full`: 500 on both): on the Citus cluster an
#: example costs about twice its plain-PostgreSQL time, so CI runs fewer there (issue 18).
CI_EXAMPLES = {"postgres": 8, "citus": 3}


@pytest.mark.timeout(5400 if FULL else 600)
def test_devices_converge(request: pytest.FixtureRequest, world: World) -> None:
    Convergence.world = world

    class Checked(Convergence):
        def teardown(self) -> None:
            try:
                self.converge()
            finally:
                super().teardown()

    runner = Checked.TestCase
    examples = 500 if FULL else CI_EXAMPLES[backend_of(request)]
    runner.settings = settings(
        max_examples=examples,
        stateful_step_count=40 if FULL else 25,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    )
    runner("runTest").runTest()
    print(f"convergence: {Convergence.examples_run} examples run")
