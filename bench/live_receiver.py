"""Device B of the live sync latency row (bench.live_latency), in a process of its own.

Real devices are separate processes (mostly on separate machines): with the four
receiving devices as threads of the measuring process, their applies and the senders'
pushes took turns for one interpreter lock, which added about 4 ms to the median and most
of the tail (one pair alone against four, same background). So each receiver runs here:
`python -m bench.live_receiver DIR RELAY_URL KEY VAULT_ID` opens a SQLCipher vault in
DIR, links it, and runs the real live sync behind `Vault.watch` (client._flows.live
.LiveSync, its default timing and feed, the timer set to an hour so only the feed makes
it sync).

Lines on stdin: `expect <memory_id>` (the next memory to watch for, answered with
`expecting <memory_id>` once taken). Lines on stdout: `connected` (the event stream is
up), `applied <t> <hinted> <synced>` once the expected memory is applied and committed
(the page's transaction in engrams.db ended: `Syncer._apply_page` returned, on B's sync
thread, which then reads the memory back; `hinted`: the
first change hint after the `expect`, `synced`: the first sync started after that hint,
0 when none), `saved <t>` when the cursor was saved after that page (the pull's
progress callback), `reported <t>` when that sync's report is out, `failed <why>`. Times are
`time.monotonic()`, one clock for every process of the machine (CLOCK_MONOTONIC on
Linux). It stops when stdin closes.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import Any, Final, TextIO

from engram_sync.client._errors import RateLimitedError, RelayUnavailableError
from engram_sync.client._flows.live import CONNECTED, LiveStatus, LiveSync
from engram_sync.client._session import VaultSession
from engram_sync.client._sync.engine import Syncer
from engram_sync.client._sync.reports import SyncReport
from engram_sync.client._vault import store as local_store

PASSPHRASE: Final = "engram bench live passphrase: correct horse battery staple"  # noqa: S105


class Receiver:
    """The live sync of one vault, telling `out` when the expected memory is applied."""

    def __init__(self, directory: Path, relay_url: str, key: str, vault_id: str, out: TextIO):
        self.directory, self.relay_url, self.key, self.vault_id = (
            directory, relay_url, key, vault_id,
        )  # fmt: skip
        self.out = out
        self.stop = threading.Event()
        self._lock = threading.Lock()
        self._expected: str | None = None
        self._applied = False
        self._saved = False
        self._reported = False
        self._connected = False
        self.hinted_at = 0.0
        self.synced_at = 0.0

    def say(self, line: str) -> None:
        with self._lock:
            self.out.write(line + "\n")
            self.out.flush()

    def expect(self, memory_id: str) -> None:
        with self._lock:
            self._expected = memory_id
            self.hinted_at = self.synced_at = 0.0
            self._applied = self._saved = self._reported = False

    def run(self) -> None:
        with VaultSession.open(self.directory, PASSPHRASE, create=True) as session:
            session.link(self.relay_url, self.key, self.vault_id, "bench-live-b")
            _ = session.keys  # the key derivation, before any clock
            self._watch(session)

    def _watch(self, session: VaultSession) -> None:
        syncer = session.syncer

        def on_applied() -> None:
            with self._lock:
                expected, done = self._expected, self._applied
            if expected is None or done:
                return
            if local_store.get_memory(session.vault.conn, expected) is not None:
                now = time.monotonic()
                with self._lock:
                    self._applied = True
                self.say(f"applied {now} {self.hinted_at} {self.synced_at}")

        def on_progress(phase: str, report: SyncReport) -> None:
            with self._lock:
                due = phase == "pull" and self._applied and not self._saved
                self._saved = self._saved or due
            if due:  # the cursor's save after the page (the pull's progress callback)
                self.say(f"saved {time.monotonic()}")

        def on_report(report: SyncReport) -> None:
            with self._lock:
                due = self._applied and not self._reported
                self._reported = self._reported or due
            if due:
                self.say(f"reported {time.monotonic()}")

        def on_status(status: LiveStatus) -> None:
            if status.state == CONNECTED and status.mode == "events" and not self._connected:
                self._connected = True
                self.say("connected")

        # The clock stops when the page holding the memory is committed to the vault (the
        # very syncer LiveSync builds, its `_apply_page` returned: the memory is in
        # engrams.db for every reader, before the sync's own bookkeeping, the cursor's
        # save, which the pull's progress callback follows); and the start of its syncs
        # (where B's part of the time goes).
        def make_syncer(*args: Any, **kwargs: Any) -> Syncer:
            made = syncer(*args, **{**kwargs, "progress": on_progress})
            real_sync, real_apply = made.sync, made._apply_page

            def timed_apply(*page: Any, **options: Any) -> int:
                highest = real_apply(*page, **options)
                on_applied()
                return highest

            made._apply_page = timed_apply  # type: ignore[method-assign]

            def timed_sync(**options: Any) -> SyncReport:
                if self.hinted_at and not self.synced_at:
                    self.synced_at = time.monotonic()
                return real_sync(**options)

            made.sync = timed_sync  # type: ignore[method-assign]
            return made

        session.syncer = make_syncer  # type: ignore[method-assign]
        live = LiveSync(
            session, interval=3600.0, stop=self.stop,
            retry=lambda e: isinstance(e, RelayUnavailableError | RateLimitedError),
            on_report=on_report, on_status=on_status,
        )  # fmt: skip
        offer = live.signals.offer_hint

        def timed_offer(cursor: int) -> None:
            if not self.hinted_at:
                self.hinted_at = time.monotonic()
            offer(cursor)

        live.signals.offer_hint = timed_offer  # type: ignore[method-assign]
        for _ in live.run():
            pass


def main(argv: list[str]) -> int:
    directory, relay_url, key, vault_id = argv[:4]
    receiver = Receiver(Path(directory), relay_url, key, vault_id, sys.stdout)

    def commands() -> None:
        for line in sys.stdin:
            word, _, rest = line.strip().partition(" ")
            if word == "expect":
                receiver.expect(rest)
                receiver.say(f"expecting {rest}")
        receiver.stop.set()  # stdin closed: the measuring process is done

    threading.Thread(target=commands, name="bench-receiver-stdin", daemon=True).start()
    try:
        receiver.run()
    except BaseException as exc:  # told to the measuring process, which counts it
        receiver.say(f"failed {exc!r}"[:300].replace("\n", " "))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
