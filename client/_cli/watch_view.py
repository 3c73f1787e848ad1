"""What `engram-sync watch` shows: one live status line on a terminal (rich), plain lines
when stderr is not a terminal (a log, a service manager)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Final

from rich.console import Console
from rich.live import Live
from rich.text import Text

from .._flows.live import LiveStatus
from .support import out

_MODES: Final = {"events": "live events", "long-poll": "long-poll", "poll": "timer only"}
_STYLES: Final = {
    "connected": "green",
    "catching up": "cyan",
    "offline": "red",
    "polling": "yellow",
    "connecting": "yellow",
}


def describe(status: LiveStatus) -> str:
    """The status as one line of text."""
    parts = [status.state]
    if status.mode is not None:
        parts[0] += f" ({_MODES.get(status.mode, status.mode)})"
    when = status.last_sync_at
    parts.append(f"last sync {when[11:19]} UTC" if when else "not synced yet")
    parts.append(f"{status.pending} pending")
    if status.problem and status.state in ("offline", "connecting", "polling"):
        parts.append(status.problem[:120])
    return " · ".join(parts)


class WatchView:
    """Plain lines: one per change of state (a sync starting is not a change worth a line)."""

    def __init__(self, console: Console) -> None:
        self.console = console
        self._shown: tuple[str, str | None, str | None] | None = None

    def show(self, status: LiveStatus) -> None:
        if status.state == "catching up":
            return
        key = (status.state, status.mode, status.problem)
        if key != self._shown:
            self._shown = key
            self.console.print(f"status: {describe(status)}", highlight=False, markup=False)

    def say(self, text: str, *, stdout: bool = False) -> None:
        (out if stdout else self.console).print(text, highlight=False, markup=False)


class LiveWatchView(WatchView):
    """One status line that rich redraws in place; messages are printed above it."""

    def __init__(self, console: Console, live: Live) -> None:
        super().__init__(console)
        self.live = live

    def show(self, status: LiveStatus) -> None:
        style = _STYLES.get(status.state, "")
        self.live.update(Text("● ", style=style) + Text(describe(status)))


@contextmanager
def watch_view(console: Console) -> Iterator[WatchView]:
    """The view for `console`: a live line on a terminal, else plain lines."""
    if not console.is_terminal:
        yield WatchView(console)
        return
    with Live(Text("● connecting"), console=console, refresh_per_second=4, transient=True) as live:
        yield LiveWatchView(console, live)
