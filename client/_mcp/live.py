"""Live sync inside `engram-sync mcp`: the loop of `engram-sync watch` on its own thread,
beside the tools (docs/mcp.md "Live sync").

The loop opens its own `Vault` (a second SQLCipher connection, bound to the loop's thread)
the way the tools do (the unlock agent's keys, else ENGRAM_PASSPHRASE) and runs
`Vault.watch`: the event stream and its fallbacks pull what other devices push, and the
writes of the tools, committed through the tools' connection, move `PRAGMA data_version`
on this one, which starts a push; the tools `nudge` the loop after each write, so it
looks at once instead of at its next check (about half a second later; docs/live-sync.md).
Writes by other programs are still found by that check.

- Locked: the loop waits for the agent to hold the keys, asking its status only (which is
  not a use of the keys: a running server never keeps a vault unlocked past the agent's
  idle timeout). Locked again while it runs (`engram-sync lock`, the idle timeout): the
  watch stops and its connection is closed within `lock_check_s`.
- Not linked: the tools work locally; the loop waits for `config.json` to change (an
  `engram-sync link` elsewhere) and tries again.
- Relay down or rate limiting: `Vault.watch` retries with backoff, the state is `offline`,
  the tools keep writing locally and what they wrote is pushed once the relay is back.
- Any other sync error (a refused key, a revoked device): the state is `stopped` with the
  error; the loop tries again when `config.json` changes or after `STOPPED_RETRY_S`.
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Final

from .. import LiveStatus, NotLinkedError, SyncError, Vault, WrongPassphraseError

log = logging.getLogger(__name__)

OFF: Final = "off"  # --no-live
LOCKED: Final = "locked"
NOT_LINKED: Final = "not linked"
STOPPED: Final = "stopped"
STARTING: Final = "starting"
STOPPED_RETRY_S: Final = 600.0
CONFIG_FILE: Final = "config.json"  # client._sync.config: where `link` writes the relay


@dataclass(frozen=True)
class LiveView:
    """The loop's state as `sync_status` shows it: `state` is one of LiveStatus's
    ("connected", "catching up", "offline", "polling", "connecting") or "off", "locked",
    "not linked", "stopped", "starting"."""

    state: str
    mode: str | None = None
    last_sync_at: str | None = None
    problem: str | None = None

    @property
    def live(self) -> bool:
        """Whether the loop syncs now (a relay that is away only delays: still live)."""
        return self.state not in (OFF, LOCKED, NOT_LINKED, STOPPED, STARTING)

    def as_dict(self) -> dict[str, Any]:
        return {
            "live": self.live,
            "live_state": self.state,
            "live_mode": self.mode,
            "live_last_sync_at": self.last_sync_at,
            "live_problem": self.problem,
        }


def agent_holds(path: Path) -> bool:
    """Whether the unlock agent holds the vault's keys, asked without using them (its
    `status`, which does not restart the idle clock)."""
    from .._agent.control import agent_state

    return agent_state(path) == "unlocked"


class LiveLoop:
    """The live sync of the vault at `path` on its own thread, from `start` to `stop`."""

    def __init__(
        self,
        path: Path,
        passphrase: str | None = None,
        *,
        enabled: bool = True,
        lock_check_s: float = 1.0,
    ) -> None:
        self.path = path
        self._passphrase = passphrase or None
        self.enabled = enabled
        self.lock_check_s = lock_check_s
        self._shutdown = threading.Event()
        self._watch_stop = threading.Event()
        self._wake = threading.Event()  # Vault.watch's `wake`: set by `nudge`
        self._view = LiveView(STARTING if enabled else OFF)
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None

    def view(self) -> LiveView:
        with self._lock:
            return self._view

    def nudge(self) -> None:
        """Say the tools just committed a write: the watch looks for it now and pushes it
        (a loop that is not watching finds it when it starts)."""
        self._wake.set()

    def start(self) -> LiveLoop:
        if self.enabled and self._thread is None:
            self._thread = threading.Thread(target=self._run, name="engram-live", daemon=True)
            self._thread.start()
        return self

    def stop(self, timeout: float = 10.0) -> None:
        """Stop the watch and close its connection (waits at most `timeout`)."""
        self._shutdown.set()
        self._watch_stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    # -- the thread -------------------------------------------------------------------------

    def _set(self, view: LiveView) -> None:
        with self._lock:
            if view != self._view:
                log.info("live sync: %s%s", view.state, f" ({view.problem})" * bool(view.problem))
            self._view = view

    def _run(self) -> None:
        while not self._shutdown.is_set():
            try:
                opened = self._open()
            except Exception as exc:  # a vault that cannot be opened: say so, try later
                self._set(LiveView(STOPPED, problem=str(exc)))
                self._shutdown.wait(STOPPED_RETRY_S)
                continue
            if opened is None:
                self._set(LiveView(LOCKED, problem="run `engram-sync unlock`"))
                self._shutdown.wait(self.lock_check_s)
                continue
            vault, from_agent = opened
            stamp = self._config_stamp()
            try:
                wait_s = self._watch(vault, from_agent)
            finally:
                vault.close()
            if wait_s:
                self._wait_for_config(stamp, wait_s)

    def _open(self) -> tuple[Vault, bool] | None:
        """The vault on this thread with the agent's keys (asked only once the agent holds
        them), else with the passphrase; None while locked."""
        if agent_holds(self.path):
            vault = Vault.open_unlocked(self.path)
            if vault is not None:
                return vault, True
        if self._passphrase is None:
            return None
        try:
            return Vault.open(self.path, self._passphrase), False
        except WrongPassphraseError:
            self._set(LiveView(STOPPED, problem="ENGRAM_PASSPHRASE does not open the vault"))
            self._shutdown.wait(STOPPED_RETRY_S)
            return None

    def _watch(self, vault: Vault, from_agent: bool) -> float:
        """Run the watch until shutdown or a lock; the seconds to wait for a new
        `config.json` before trying again (0: at once)."""
        self._watch_stop = stop = threading.Event()
        if self._shutdown.is_set():
            return 0.0
        locked = threading.Event()
        follower = None
        if from_agent:
            follower = threading.Thread(
                target=self._follow_lock,
                args=(stop, locked),
                name="engram-live-lock",
                daemon=True,
            )
            follower.start()
        try:
            for _report in vault.watch(stop=stop, on_status=self._on_status, wake=self._wake):
                pass
        except NotLinkedError:
            self._set(LiveView(NOT_LINKED, problem="run `engram-sync link` to sync"))
            return STOPPED_RETRY_S
        except SyncError as exc:
            self._set(LiveView(STOPPED, problem=str(exc)))
            return STOPPED_RETRY_S
        except Exception as exc:  # never let the loop die silently beside the tools
            log.exception("live sync stopped")
            self._set(LiveView(STOPPED, problem=f"{type(exc).__name__}: {exc}"))
            return STOPPED_RETRY_S
        finally:
            stop.set()
            if follower is not None:
                follower.join()
        if locked.is_set():
            self._set(LiveView(LOCKED, problem="run `engram-sync unlock`"))
        return 0.0

    def _follow_lock(self, stop: threading.Event, locked: threading.Event) -> None:
        while not stop.wait(self.lock_check_s):
            if not agent_holds(self.path):
                locked.set()
                stop.set()

    def _on_status(self, status: LiveStatus) -> None:
        self._set(LiveView(status.state, status.mode, status.last_sync_at, status.problem))

    def _config_stamp(self) -> tuple[int, int] | None:
        try:
            info = (self.path / CONFIG_FILE).stat()
        except OSError:
            return None
        return info.st_mtime_ns, info.st_size

    def _wait_for_config(self, stamp: tuple[int, int] | None, at_most_s: float) -> None:
        """Until `config.json` changes (a `link`), shutdown, or `at_most_s`."""
        waited = 0.0
        step = max(self.lock_check_s, 0.2)
        while waited < at_most_s and not self._shutdown.wait(step):
            waited += step
            if self._config_stamp() != stamp:
                return
