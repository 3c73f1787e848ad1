"""What `engram-sync sync` shows while it runs (issue 17, "Polish"): on a terminal a
progress bar per phase with its total and an ETA once known, and after Ctrl-C what was
kept and that the next sync resumes.

The pull total is the relay's vault sequence (`head` of a cursor pull, PROTOCOL §9) minus
the cursor the pull starts from, asked with one pull of a single blob before the sync;
the push total is the local pending count. Both are estimates (compacted tombstones and
this device's own pushes move the cursor without a blob), so a bar may end short of 100%.
"""

from __future__ import annotations

from typing import Final

import typer
from rich.progress import (
    BarColumn,
    MofNCompleteColumn,
    Progress,
    SpinnerColumn,
    TextColumn,
    TimeElapsedColumn,
    TimeRemainingColumn,
)

from .._errors import SyncError
from .._http.relay_client import RelayClient
from .._session import VaultSession
from .._sync.reports import ProgressCallback, SyncReport
from .._vault.store import count_to_push
from .support import err

#: The exit status after Ctrl-C (128 + SIGINT, the shell's convention).
INTERRUPTED_EXIT: Final = 130


def pull_total(session: VaultSession, relay: RelayClient) -> int | None:
    """How many commits the pull has ahead of it: the vault's sequence minus the cursor it
    starts from; None when the relay does not say (or says something impossible)."""
    state = session.state
    start = 0 if state.full_pull or state.link_pull else state.cursor
    try:
        page = relay.pull(session.config.vault_id or "", cursor=start, limit=1)
    except SyncError:
        return None  # the sync itself reports what is wrong
    head = page.head
    if not isinstance(head, int) or head < start:
        return None
    return head - start


def interrupted_words(report: SyncReport, session: VaultSession) -> str:
    """What Ctrl-C kept: every applied page and every accepted push batch is saved."""
    state = session.state
    again = (
        "the full re-pull starts again from cursor 0 at the next sync"
        if state.full_pull or state.link_pull
        else f"the cursor ({state.cursor}) is saved: the next `engram-sync sync` resumes there"
    )
    return (
        f"interrupted: kept what was done before Ctrl-C: pulled {report.pulled} (applied "
        f"{report.applied}), pushed {report.pushed}; {again}, and pushes what is still pending"
    )


def run_sync(session: VaultSession, show_progress: bool) -> SyncReport:
    """One sync with its progress shown on stderr when `show_progress`; after Ctrl-C,
    says what was kept and exits INTERRUPTED_EXIT."""
    seen = SyncReport()  # the engine's report as the progress callback last saw it

    def remember(phase: str, report: SyncReport) -> None:
        nonlocal seen
        seen = report

    try:
        with session.relay() as relay:
            if not show_progress:
                return session.syncer(relay, remember).sync()
            return _with_bar(session, relay, remember)
    except KeyboardInterrupt:
        err.print(interrupted_words(seen, session), markup=False, highlight=False)
        raise typer.Exit(INTERRUPTED_EXIT) from None


def _with_bar(session: VaultSession, relay: RelayClient, remember: ProgressCallback) -> SyncReport:
    columns = (
        SpinnerColumn(),
        TextColumn("{task.description}"),
        BarColumn(),
        MofNCompleteColumn(),
        TextColumn("{task.fields[detail]}"),
        TimeElapsedColumn(),
        TextColumn("eta"),
        TimeRemainingColumn(),
    )
    with Progress(*columns, console=err, transient=True) as bar:
        state = session.state
        start = 0 if state.full_pull or state.link_pull else state.cursor
        total = pull_total(session, relay)
        pending = sum(count_to_push(session.vault.conn))
        pull_task = bar.add_task("pulling", total=total, detail="")
        push_task = bar.add_task("pushing", total=pending or None, detail="")

        def progress(phase: str, report: SyncReport) -> None:
            remember(phase, report)
            if phase == "pull":
                done = max(0, report.cursor - start)
                detail = f"{report.pulled} pulled, {report.applied} applied"
                bar.update(pull_task, completed=done, detail=detail)
            else:
                bar.update(push_task, completed=report.pushed, detail=f"{report.pushed} pushed")

        return session.syncer(relay, progress).sync()
