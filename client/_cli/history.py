"""`engram-sync history`, `undelete`, `restore`, `revert`: the local history (docs/history.md).

Every version this device replaced is kept for a while (`history` without an id shows how
long and how much); `undelete` and `restore` bring one back as a new version, `revert`
takes back what one device, source or AI tool wrote. What they write is an ordinary local
edit: `sync` (or a running `watch`) takes it to every device.
"""

from __future__ import annotations

import json
import re
import sys
from dataclasses import asdict
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Annotated, Any

import typer

from engram_sync.shared_format.plaintext import encode_memory
from engram_sync.shared_format.timestamps import parse_rfc3339

from .._vault import history
from .._vault.revert import RevertPlan, Selector, plan_revert, run_revert
from .support import CliError, err, open_session, out, print_json
from .sync_command import sync

if TYPE_CHECKING:
    from .._session import VaultSession

_RELATIVE = re.compile(r"^(\d{1,6})([smhd])$")
_UNITS = {"s": "seconds", "m": "minutes", "h": "hours", "d": "days"}


def parse_since(text: str, now: datetime | None = None) -> datetime:
    """`--since`: an RFC 3339 time, a date (midnight UTC), or an age such as 30m, 2h, 7d."""
    match = _RELATIVE.match(text.strip())
    if match:
        delta = timedelta(**{_UNITS[match[2]]: int(match[1])})
        return (now or datetime.now(UTC)) - delta
    try:
        return parse_rfc3339(text.strip())
    except ValueError:
        pass
    try:
        return datetime.strptime(text.strip(), "%Y-%m-%d").replace(tzinfo=UTC)
    except ValueError:
        raise CliError(
            f"--since {text!r}: give a time (2026-12-04T10:00:00Z), a date (2026-12-04)"
            " or an age (30m, 2h, 7d)"
        ) from None


def _who(writer: history.Writer) -> str:
    device = (writer.device_id or "?")[:8]
    parts = [device if writer.label is None else f"{device} ({writer.label})"]
    parts += [p for p in (writer.source, writer.tool) if p]
    return " ".join(parts)


def _first_line(version: history.Version) -> str:
    if version.memory is None:
        return "(deleted)"
    lines = version.memory.content.splitlines()
    return (lines[0] if lines else "")[:70]


def history_command(
    memory_id: Annotated[
        str | None, typer.Argument(help="Memory id (without it: the retention settings).")
    ] = None,
    keep_days: Annotated[
        float | None, typer.Option("--keep-days", help="Keep versions this many days.")
    ] = None,
    max_percent: Annotated[
        float | None,
        typer.Option("--max-percent", help="Keep at most this % of the vault's size."),
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
) -> None:
    """Show a memory's kept versions (`restore ID --version N` brings one back)."""
    with open_session() as session:
        if memory_id is None:
            _retention(session, keep_days, max_percent, json_out)
            return
        if keep_days is not None or max_percent is not None:
            raise CliError("--keep-days and --max-percent go without a memory id")
        found = history.versions(session.vault.conn, memory_id, session.device.device_id)
    if json_out:
        print_json([_version_json(v) for v in found])
        return
    if not found:
        raise CliError(f"no memory {memory_id!r} and no kept version of one by that id")
    for v in found:
        when = (v.written.at or "")[:19]
        state = "current" if v.current else f"replaced {(v.replaced_at or '')[:19]} ({v.reason})"
        out.print(
            f"v{v.version}  {when}  by {_who(v.written)}  {state}  {_first_line(v)}",
            markup=False,
        )


def _version_json(version: history.Version) -> dict[str, Any]:
    memory = version.memory
    return {
        **asdict(version),
        "memory": None if memory is None else json.loads(encode_memory(memory)),
    }


def _retention(
    session: VaultSession, keep_days: float | None, max_percent: float | None, json_out: bool
) -> None:
    with session.vault.transaction() as conn:
        current = history.retention(conn)
        if keep_days is not None or max_percent is not None:
            changed = history.Retention(
                keep_days if keep_days is not None else current.keep_days,
                max_percent if max_percent is not None else current.max_percent,
                current.min_bytes,
            )
            try:
                history.set_retention(conn, changed)
            except history.HistoryError as exc:
                raise CliError(str(exc)) from None
            current = changed
        used, cap = history.capped_bytes(conn), history.cap_bytes(conn, current)
    info: dict[str, Any] = {**asdict(current), "capped_bytes": used, "cap_bytes": cap}
    if json_out:
        print_json(info)
        return
    out.print(
        f"history: versions kept {current.keep_days:g} days; replaced versions use"
        f" {used:,} of {cap:,} bytes ({current.max_percent:g}% of the vault, at least"
        f" {current.min_bytes:,}); a deleted memory's last version is kept the full"
        " days whatever its size",
        markup=False,
    )


def undelete(
    memory_ids: Annotated[list[str], typer.Argument(help="Ids of deleted memories.")],
) -> None:
    """Bring deleted memories back (each as its newest kept version, a new edit)."""
    with open_session() as session, session.vault.transaction() as conn:
        for memory_id in memory_ids:
            try:
                history.undelete(
                    conn, memory_id, session.writer(), own_device=session.device.device_id
                )
            except history.HistoryError as exc:
                raise CliError(f"{exc}; nothing was undeleted") from None
    done = ", ".join(memory_ids)
    out.print(f"undeleted {done}; `engram-sync sync` takes it to the other devices", markup=False)


def restore(
    memory_id: Annotated[str, typer.Argument(help="Memory id.")],
    version: Annotated[int, typer.Option("--version", help="The version (see `history ID`).")],
) -> None:
    """Bring back one kept version of a memory as its newest version."""
    with open_session() as session, session.vault.transaction() as conn:
        try:
            history.restore(
                conn, memory_id, version, session.writer(), own_device=session.device.device_id
            )
        except history.HistoryError as exc:
            raise CliError(str(exc)) from None
    out.print(f"restored {memory_id} to version {version}; `engram-sync sync` takes it"
              " to the other devices", markup=False)  # fmt: skip


def summary(plan: RevertPlan, who: str) -> str:
    """What a revert does, in one line."""
    parts = [
        f"{plan.count('restore')} restored to an earlier version",
        f"{plan.count('undelete')} undeleted",
        f"{plan.count('delete')} deleted (created by them)",
    ]
    line = f"revert of {who}: {len(plan.steps)} memories: " + ", ".join(parts)
    if plan.unrevertible:
        line += f"; {len(plan.unrevertible)} cannot be reverted (earlier versions pruned)"
    return line


def revert(
    device: Annotated[str | None, typer.Option("--device", help="Device id.")] = None,
    source: Annotated[str | None, typer.Option("--source", help="Source, e.g. ai-tool.")] = None,
    tool: Annotated[str | None, typer.Option("--tool", help="AI tool name.")] = None,
    since: Annotated[
        str | None, typer.Option("--since", help="Only writes after: a time, date or 2h.")
    ] = None,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Say what it would do.")] = False,
    yes: Annotated[bool, typer.Option("--yes", help="Do not ask.")] = False,
    json_out: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
) -> None:
    """Take back what a device, source or AI tool wrote (a summary first, then a question)."""
    if device is None and source is None and tool is None:
        raise CliError("say whose writes to revert: --device ID, --source SOURCE or --tool NAME")
    selector = Selector(device, source, tool, None if since is None else parse_since(since))
    named = (("device", device), ("source", source), ("tool", tool), ("since", since))
    who = " ".join(f"{name} {value}" for name, value in named if value is not None)
    with open_session() as session:
        own = session.device.device_id
        plan = plan_revert(session.vault.conn, selector, own)
        if json_out and dry_run:
            print_json(asdict(plan))
            return
        err.print(summary(plan, who), markup=False, highlight=False)
        if dry_run or not plan.steps:
            return
        if not yes:
            if not sys.stdin.isatty():
                raise CliError("nothing was reverted: pass --yes to revert without a question")
            if not typer.confirm("Revert these memories?", default=False, err=True):
                raise CliError("nothing was reverted")
        done = run_revert(session.vault, plan.steps, session.writer(), own_device=own)
        linked = bool(session.config.server_url)
    if json_out:
        print_json({**asdict(plan), "done": done})
    else:
        out.print(f"reverted {done} memories", markup=False)
    if linked:
        sync(json_out=False)  # on every device: the others take it at their next sync
    else:
        err.print("this vault is not linked: the revert stays on this device until `link`")


def register(app: typer.Typer) -> None:
    """Add the history commands to the `engram-sync` app."""
    app.command("history")(history_command)
    app.command("undelete")(undelete)
    app.command("restore")(restore)
    app.command("revert")(revert)
