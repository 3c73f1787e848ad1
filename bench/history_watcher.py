"""A watching device of the revert row of `bench.history`, in a process of its own.

`python -m bench.history_watcher DIR` opens the (linked) SQLCipher vault in DIR with the
bench's passphrase and runs the real live sync behind `Vault.watch` / `engram-sync watch`
(client._flows.live.LiveSync, its default timing and feed; the timer set to an hour, so
only the feed and local writes make it sync). Lines on stdout: `connected` (the event
stream is up), `held <t> <count>` after every pulled page is committed to the vault
(`Syncer._apply_page` returned; `count`: the memories the vault holds then, `t`:
`time.monotonic()`, one clock for every process of the machine), `failed <why>`. It stops
when stdin closes.
"""

from __future__ import annotations

import cProfile
import os
import sys
import threading
import time
from pathlib import Path
from typing import Any, Final

from engram_sync.client._errors import RateLimitedError, RelayUnavailableError
from engram_sync.client._flows.live import CONNECTED, LiveStatus, LiveSync
from engram_sync.client._session import VaultSession
from engram_sync.client._sync.engine import Syncer

PASSPHRASE: Final = "engram bench history: correct horse battery staple"  # noqa: S105


def watch(directory: Path, stop: threading.Event, say: Any) -> None:
    """The live sync of the vault in `directory` until `stop`, saying what it holds."""
    with VaultSession.open(directory, PASSPHRASE) as session:
        _ = session.keys  # the key derivation, before anything is measured
        syncer = session.syncer
        connected = False

        def make_syncer(*args: Any, **kwargs: Any) -> Syncer:
            made = syncer(*args, **kwargs)
            real_apply = made._apply_page

            def counted_apply(*page: Any, **options: Any) -> int:
                highest = real_apply(*page, **options)
                count = session.vault.conn.execute("SELECT count(*) FROM engrams").fetchone()[0]
                say(f"held {time.monotonic()} {count}")
                return highest

            made._apply_page = counted_apply  # type: ignore[method-assign]
            return made

        def on_status(status: LiveStatus) -> None:
            nonlocal connected
            if status.state == CONNECTED and status.mode == "events" and not connected:
                connected = True
                say("connected")

        session.syncer = make_syncer  # type: ignore[method-assign]
        live = LiveSync(
            session, interval=3600.0, stop=stop,
            retry=lambda e: isinstance(e, RelayUnavailableError | RateLimitedError),
            on_status=on_status,
        )  # fmt: skip
        for _ in live.run():
            pass


def main(argv: list[str]) -> int:
    lock = threading.Lock()
    stop = threading.Event()

    def say(line: str) -> None:
        with lock:
            sys.stdout.write(line + "\n")
            sys.stdout.flush()

    def wait_for_eof() -> None:
        for _ in sys.stdin:
            pass
        stop.set()  # stdin closed: the measuring process is done

    threading.Thread(target=wait_for_eof, name="bench-history-stdin", daemon=True).start()
    profile = os.environ.get("ENGRAM_BENCH_WATCHER_PROFILE")  # a file for cProfile's stats
    profiler = cProfile.Profile() if profile else None
    try:
        if profiler is not None:
            profiler.enable()
        watch(Path(argv[0]), stop, say)
    except BaseException as exc:  # told to the measuring process, which counts it
        say(f"failed {exc!r}"[:300].replace("\n", " "))
        return 1
    finally:
        if profiler is not None:
            profiler.disable()
            profiler.dump_stats(f"{profile}.{os.getpid()}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
