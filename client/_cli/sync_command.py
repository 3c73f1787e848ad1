"""`engram-sync sync`: pull, then push, and say what happened; `revert` runs it too
(client._cli.history). What it shows while it runs is client._cli.sync_view's."""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated, Any, Final

import typer

from .._errors import VaultRetiredError
from .._sync.unpushable import shown_id
from .support import err, open_session, out, print_json

if TYPE_CHECKING:
    from .._sync.reports import SyncReport


def repair_notice(report: SyncReport) -> str | None:
    """What a full re-pull did, said once, on the sync that did it (PROTOCOL §17)."""
    if report.restored:
        return (
            "the relay has lost changes this device had seen (it was restored from an older "
            "backup, or its vault sequence went back): this device pulled everything again "
            f"and pushed back {report.repushed} version(s) the relay lacked; nothing was "
            "deleted here"
        )
    if report.resynced:
        return (
            "the relay asked for a full re-pull (resync_required): done; "
            f"{report.repushed} version(s) the relay lacked were pushed back, nothing was "
            "deleted here"
        )
    return None


def _report_dict(report: SyncReport) -> dict[str, Any]:
    return asdict(report)


def sync(json_out: Annotated[bool, typer.Option("--json", help="JSON output.")] = False) -> None:
    """Pull remote changes, then push local ones."""
    from . import rekey_join
    from .sync_view import run_sync as _run_sync

    with open_session() as session:
        try:
            report = _run_sync(session, show_progress=not json_out and err.is_terminal)
        except VaultRetiredError:  # PROTOCOL §19: an account vault follows with the wrap
            if not rekey_join.follow_successor(session):
                raise
            report = _run_sync(session, show_progress=not json_out and err.is_terminal)
    if json_out:
        print_json(_report_dict(report))
        _exit_if_kept_local(report)
        return
    parts = [f"pulled {report.pulled} (applied {report.applied}), pushed {report.pushed}"]
    notice = repair_notice(report)
    if notice:
        err.print(notice, highlight=False, markup=False)
    if report.conflicts:
        parts.append(f"{report.conflicts} conflict(s) kept: see `engram-sync conflicts`")
    if report.invalid:
        parts.append(f"{report.invalid} invalid blob(s) skipped: see `engram-sync status`")
    if report.oversized:
        parts.append(f"{len(report.oversized)} memory(ies) too large to sync")
    out.print(", ".join(parts), markup=False)
    for line in kept_local_lines(report):
        err.print(line, markup=False)
    _exit_if_kept_local(report)


#: issue 31: the memories a sync names as not pushed (one line each); the rest are counted
SHOWN_UNPUSHABLE: Final = 20
#: the exit status of a sync that ran but kept memories local the relay refuses (issue 31)
#: or that are larger than it takes: in both, something the user wrote is on no other device
EXIT_UNPUSHABLE: Final = 3


def kept_local_lines(report: SyncReport) -> list[str]:
    """One line a memory the sync kept local (refused by the relay, or larger than it takes),
    at most SHOWN_UNPUSHABLE of each kind named, the rest counted (issue 31)."""
    refused = [
        (shown_id(u.memory_id), u.reason, "add its content again with `engram-sync add`, then "
         "delete it") for u in report.unpushable
    ]  # fmt: skip
    too_large = [
        (shown_id(m), "larger than the relay takes", "shorten it with `engram-sync edit`, or "
         "split it") for m in report.oversized
    ]  # fmt: skip
    lines: list[str] = []
    for kind, named in (("not pushed", refused), ("too large", too_large)):
        lines += [
            f"not pushed: memory {memory}: {why}; it stays in this vault only ({what_to_do})"
            for memory, why, what_to_do in named[:SHOWN_UNPUSHABLE]
        ]
        if len(named) > SHOWN_UNPUSHABLE:
            lines.append(f"  ... and {len(named) - SHOWN_UNPUSHABLE} more {kind}")
    return lines


def _exit_if_kept_local(report: SyncReport) -> None:
    """A sync that pushed everything else but set memories aside ends with its own status."""
    if report.unpushable or report.oversized:
        raise typer.Exit(EXIT_UNPUSHABLE)
