"""The `engram-relay` command: serve, migrate, keys, devices, gc, scrub, stats, backup, restore."""

from __future__ import annotations

import asyncio
import logging
import sys
from datetime import timedelta
from typing import Annotated

import asyncpg
import typer
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from engram_sync import __version__
from engram_sync.cli_kit.usage import debug_option, run, version_option
from engram_sync.relay.cli import backup as ops
from engram_sync.relay.cli import vaults as cli_vaults
from engram_sync.relay.cli.options import DatabaseUrl, DataDir
from engram_sync.relay.cli.support import CliError, check_vault, on_connection, run_db
from engram_sync.relay.db.citus import CitusError
from engram_sync.relay.db.failures import DatabaseFailureError
from engram_sync.relay.db.runtime import database, default_relay_dir, save_admin_key
from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.services.config import DEFAULT_PORT, DEFAULT_RETENTION_DAYS, config_from_env
from engram_sync.relay.serving.connections import limits_from_env
from engram_sync.relay.serving.logs import configure_logging
from engram_sync.relay.serving.server import (
    PortInUseError,
    export_for_workers,
    open_listeners,
    serve_app,
)
from engram_sync.relay.store import devices
from engram_sync.relay.store import minted_keys as key_store
from engram_sync.shared_format.ids import check_id
from engram_sync.shared_format.wire import DeviceEntry

log = logging.getLogger("engram_sync.relay.cli.main")
app = typer.Typer(
    help="Engram Sync relay: a zero-knowledge sync relay on PostgreSQL. "
    "Errors are one line; add --debug to any command for the full traceback.",
    no_args_is_help=True,
    pretty_exceptions_enable=False,
)
keys_app = typer.Typer(help="Mint, list and revoke API keys.", no_args_is_help=True)
devices_app = typer.Typer(help="List and revoke a vault's devices.", no_args_is_help=True)
app.add_typer(keys_app, name="keys")
app.add_typer(devices_app, name="devices")
app.add_typer(cli_vaults.vaults_app, name="vaults")
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 240)
err = Console(stderr=True, soft_wrap=True)


@app.callback()
def _main(
    version: Annotated[bool, version_option("engram-relay", __version__)] = False,
    debug: Annotated[bool, debug_option()] = False,
) -> None:
    """Engram Sync relay: a zero-knowledge sync relay on PostgreSQL."""


@app.command()
# long: the command's options are its signature (typer)
def serve(
    host: Annotated[
        str, typer.Option(help="Address to bind.", envvar="ENGRAM_RELAY_HOST")
    ] = "127.0.0.1",
    port: Annotated[
        int, typer.Option(help="Port to bind.", envvar="ENGRAM_RELAY_PORT")
    ] = DEFAULT_PORT,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
    quota_devices: Annotated[
        int | None, typer.Option(help="Max devices per vault (0 = unlimited).")
    ] = None,
    quota_bytes: Annotated[
        int | None, typer.Option(help="Max stored ciphertext bytes per vault (0 = unlimited).")
    ] = None,
    log_level: Annotated[str, typer.Option(help="debug, info, warning, error.")] = "info",
    log_format: Annotated[str, typer.Option(help="json or text.")] = "json",
    workers: Annotated[
        int,
        typer.Option(
            min=1,
            help="Worker processes sharing the port (one per core helps on a machine with "
            "cores to spare; each opens its own database pool).",
            envvar="ENGRAM_RELAY_WORKERS",
        ),
    ] = 1,
) -> None:
    """Run the relay (on an embedded PostgreSQL unless a database URL is given)."""
    configure_logging(log_level, log_format)
    relay_dir = data_dir or default_relay_dir()
    limits = limits_from_env()  # a bad ENGRAM_RELAY_*_TIMEOUT_S fails before anything starts
    try:  # bind first: a taken port fails before the database starts or a key is minted
        sockets = open_listeners(host, port, workers=workers)
    except PortInUseError as exc:
        hint = "stop what holds it or choose another with --port"
        if exc.reason != "the port is in use":
            hint = "check --host and --port"
        raise CliError(f"{exc}; {hint}") from None
    port = sockets[0].getsockname()[1]  # the one the kernel chose for --port 0
    try:
        with database(database_url, relay_dir, migrate=True) as url:
            config = config_from_env(url, quota_devices=quota_devices, quota_bytes=quota_bytes)
            # PROTOCOL §13: static keys claim their vaults; one an account owns stops start-up.
            refused = asyncio.run(cli_vaults.claim_static_vaults(url, config.static_keys))
            if refused:
                raise CliError("; ".join(refused))
            first_key = _first_admin_key(url, has_static=bool(config.static_keys))
            base = f"http://{host}:{port}"
            # issue 17: with --log-format json the log (stderr) is JSON lines only and what
            # is printed for a person (stdout) has no styling: no escapes on a terminal. The
            # first admin key is printed, never logged.
            plain = log_format == "json"
            if plain:
                log.info("relay listening", extra={"url": base, "workers": workers})
                print(f"Engram Sync relay listening on {base}", flush=True)
            else:
                out.print(f"Engram Sync relay listening on [bold]{base}[/bold]")
            if first_key is not None:
                path = save_admin_key(relay_dir, first_key)
                if plain:
                    print(f"First admin key (shown once, saved 0600 in {path}):", flush=True)
                    print(f"  {first_key}", flush=True)
                else:
                    out.print(f"First admin key (shown once, saved 0600 in {path}):")
                    out.print(f"  [bold]{first_key}[/bold]")
            if workers > 1:
                overrides = {"quota_devices": quota_devices, "quota_bytes": quota_bytes}
                export_for_workers(url, overrides, log_level, log_format)
                print(f"{workers} worker processes", flush=True)
            serve_app(config, host=host, port=port, workers=workers, sockets=sockets, limits=limits)
    finally:
        for sock in sockets:
            sock.close()
    log.info("relay stopped")


def _first_admin_key(url: str, *, has_static: bool) -> str | None:
    """Mint an operator key when the relay has no keys at all (first start)."""
    if has_static:
        return None

    async def go(conn: asyncpg.Connection) -> str | None:
        async with conn.transaction():
            await conn.execute("LOCK TABLE api_keys IN EXCLUSIVE MODE")
            if await key_store.count_keys(conn):
                return None
            _, key = await key_store.create_key(
                conn, vault_id=None, is_admin=True, label="first admin key"
            )
            return key

    return asyncio.run(on_connection(url, go))


@app.command()
def migrate(
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
    citus: Annotated[
        bool,
        typer.Option(
            "--citus",
            help="The database is a Citus coordinator: create the citus extension if "
            "missing, then distribute every table by vault_id or make it a reference "
            "table (deploy/SCALING.md). Detected without the flag once the extension exists.",
        ),
    ] = False,
) -> None:
    """Apply database migrations (forward-only) and exit."""
    try:
        with database(database_url, data_dir, migrate=True, citus=citus):
            suffix = " (distributed on Citus)" if citus else ""
            out.print(f"database is at the latest schema{suffix}")
    except CitusError as exc:
        raise CliError(str(exc)) from None


@keys_app.command("create")
def keys_create(
    vault: Annotated[str, typer.Option("--vault", help="Vault id the key is valid for.")],
    admin: Annotated[bool, typer.Option("--admin", help="Admin on that vault.")] = False,
    device: Annotated[
        str | None, typer.Option("--device", help="Bind the key to one device id.")
    ] = None,
    rate: Annotated[int, typer.Option("--rate", help="Requests per second.", min=1)] = 100,
    label: Annotated[str | None, typer.Option("--label", help="A note for `keys list`.")] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Mint even into a vault an account owns.")
    ] = False,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Mint a key for one vault; it is printed once and stored only as a hash.

    A vault nobody has used becomes the operator's; one an account owns is refused
    unless --force (PROTOCOL §13)."""
    check_vault(vault)
    if device is not None and check_id(device, "device id"):
        raise CliError(f"invalid device id: {check_id(device, 'device id')}")
    try:
        key_id, key, owner = run_db(
            database_url,
            data_dir,
            lambda c: cli_vaults.mint_operator_key(
                c, vault_id=vault, force=force, is_admin=admin, device_id=device, rate=rate,
                label=label,
            ),
        )  # fmt: skip
    except cli_vaults.AccountOwnedError as exc:
        raise CliError(str(exc)) from None
    if owner.account_id is not None:
        err.print(f"note: vault {vault} stays owned by account "
                  f"{cli_vaults.account_prefix(owner.account_id)} (--force)")  # fmt: skip
    err.print(f"key {key_id} for vault {vault}{' (admin)' if admin else ''} — shown once:")
    out.print(key)


@keys_app.command("list")
def keys_list(database_url: DatabaseUrl = None, data_dir: DataDir = None) -> None:
    """List minted keys (ids and prefixes, never the keys)."""
    records = run_db(database_url, data_dir, key_store.list_keys)
    table = Table("id", "prefix", "vault", "admin", "device", "rate", "label", "created", "revoked")
    for r in records:
        table.add_row(
            r.id,
            r.prefix + "…",
            r.vault_id or "(all)",
            "yes" if r.is_admin else "",
            r.device_id or "",
            str(r.rate_per_sec),
            r.label or "",
            r.created_at.isoformat(timespec="seconds"),
            r.revoked_at.isoformat(timespec="seconds") if r.revoked_at else "",
        )
    out.print(table)


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="Key id from `keys list`.")],
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Revoke a key by id (takes effect on the next request, on every replica)."""
    if not run_db(database_url, data_dir, lambda c: key_store.revoke_key(c, key_id)):
        raise CliError(f"no key with id {key_id!r}; see `engram-relay keys list`")
    out.print(f"key {key_id} revoked")


@devices_app.command("list")
def devices_list(
    vault: Annotated[str, typer.Option("--vault", help="Vault id.")],
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Show a vault's device roster."""
    check_vault(vault)
    with database(database_url, data_dir, migrate=True) as url:

        async def go() -> list[DeviceEntry]:
            pool = await asyncpg.create_pool(to_libpq_url(url), min_size=1, max_size=1)
            try:
                return await devices.roster(pool, vault)
            finally:
                await pool.close()

        entries = asyncio.run(go())
    table = Table("device", "label", "last seen", "blobs", "revoked")
    for d in entries:
        table.add_row(d.device_id, d.label or "", d.last_seen or "", str(d.blob_count),
                      "yes" if d.revoked else "")  # fmt: skip
    out.print(table)


async def _device_known(conn: asyncpg.Connection, vault_id: str, device_id: str) -> bool:
    """Whether the vault has heard of the device: on its roster (it pushed, pulled or
    registered, or was revoked before), with blobs, or with a key bound to it."""
    known: bool = await conn.fetchval(
        "SELECT EXISTS (SELECT 1 FROM devices WHERE vault_id = $1 AND device_id = $2)"
        " OR EXISTS (SELECT 1 FROM blobs WHERE vault_id = $1 AND device_id = $2)"
        " OR EXISTS (SELECT 1 FROM api_keys WHERE vault_id = $1 AND device_id = $2)",
        vault_id,
        device_id,
    )
    return known


@devices_app.command("revoke")
def devices_revoke(
    device_id: Annotated[str, typer.Argument(help="Device id to revoke.")],
    vault: Annotated[str, typer.Option("--vault", help="Vault id.")],
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Revoke a device id the vault has never seen (pre-revoke it on purpose).",
        ),
    ] = False,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Revoke a device and every key bound to it; its pushes and pulls are refused.

    A device id the vault has never seen (a typo, most likely) is refused unless --force.
    """
    check_vault(vault)
    problem = check_id(device_id, "device id")
    if problem:
        raise CliError(problem)
    with database(database_url, data_dir, migrate=True) as url:

        async def go() -> int | None:
            pool = await asyncpg.create_pool(to_libpq_url(url), min_size=1, max_size=1)
            try:
                if not force:
                    async with pool.acquire() as conn:
                        if not await _device_known(conn, vault, device_id):
                            return None
                return await devices.revoke(pool, vault, device_id)
            finally:
                await pool.close()

        revoked_keys = asyncio.run(go())
    if revoked_keys is None:
        raise CliError(
            f"vault {vault} has no device {device_id!r}; check the id with "
            f"`engram-relay devices list --vault {vault}`, or pass --force to pre-revoke it"
        )
    out.print(f"device {device_id} revoked in vault {vault} ({revoked_keys} bound key(s) revoked)")


@app.command()
def gc(
    retention_days: Annotated[
        int, typer.Option(help="Keep tombstones at least this many days.", min=0)
    ] = DEFAULT_RETENTION_DAYS,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Compact tombstones now (only those every active device has pulled past), and erase
    expired handoff seals, pairing codes and sessions."""
    from engram_sync.relay.services.maintenance import Sweep, sweep

    # What a serving relay's background maintenance runs (relay.services.maintenance).
    done: Sweep = run_db(
        database_url, data_dir, lambda conn: sweep(conn, timedelta(days=retention_days))
    )
    out.print(f"removed {done.tombstones_removed} tombstone(s) from {len(done.compacted)} vault(s)")
    out.print("expired and erased: " + ", ".join(f"{n} {what}" for what, n in done.erased.items()))


@app.command()
def scrub(
    vault: Annotated[
        str | None, typer.Argument(help="Only this vault (default: every vault).")
    ] = None,
    timeout_s: Annotated[
        float,
        typer.Option(
            "--timeout", help="Give up a vault's pass after this many seconds.", min=0.001
        ),
    ] = 600.0,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Recompute vaults' digests, counts and bucket prefixes from their rows now and make the
    stored ones true (what the background scrub does; PROTOCOL §18, docs/digest.md)."""
    from engram_sync.relay.services.maintenance import report_scrubs
    from engram_sync.relay.store.scrub import ScrubResult, scrub_vault

    if vault is not None:
        check_vault(vault)
    timeout_ms = max(1, round(timeout_s * 1000))

    async def work(conn: asyncpg.Connection) -> list[ScrubResult]:
        if vault is not None:
            ids = [vault]
        else:
            rows = await conn.fetch(
                "SELECT vault_id FROM vaults ORDER BY scrubbed_at NULLS FIRST, vault_id"
            )
            ids = [r["vault_id"] for r in rows]
        return [await scrub_vault(conn, v, timeout_ms) for v in ids]

    done: list[ScrubResult] = run_db(database_url, data_dir, work)
    if vault is not None and done[0].outcome == "gone":
        raise CliError(
            f"no vault {vault!r} holds blobs on this relay; see `engram-relay vaults list`"
        )
    report_scrubs(done, None)
    for result in done:
        if result.outcome == "repaired":
            out.print(
                f"vault {result.vault_id}: stored digest disagreed with its rows "
                f"({', '.join(result.differed)}; {result.stored_count} version(s) claimed, "
                f"{result.row_count} held): made true",
                highlight=False,
            )
        elif result.outcome == "timed_out":
            err.print(
                f"vault {result.vault_id}: gave up after {timeout_s:g} s; retry with a larger "
                "--timeout",
                highlight=False,
            )
    repaired = sum(1 for r in done if r.outcome == "repaired")
    out.print(f"scrubbed {len(done)} vault(s): {repaired} mismatch(es) found and repaired")
    if any(r.outcome == "timed_out" for r in done):
        raise typer.Exit(1)


@app.command()
def pair(
    vault: Annotated[str, typer.Option("--vault", help="Vault id the new device joins.")],
    label: Annotated[
        str | None, typer.Option("--label", help="Default label of the paired device.")
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Pair even into a vault an account owns.")
    ] = False,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Print a one-time pairing code (10 minutes); a new device redeems it for its own key.

    Like `keys create`, a vault an account owns is refused unless --force (PROTOCOL §13)."""
    from engram_sync.relay.store.pairing import TooManyCodesError, create_code

    check_vault(vault)
    if label is not None and (not label.strip() or len(label) > 128):
        raise CliError("--label must be 1..128 characters")
    with database(database_url, data_dir, migrate=True) as url:

        async def go() -> tuple[str, str]:
            pool = await asyncpg.create_pool(to_libpq_url(url), min_size=1, max_size=1)
            try:
                async with pool.acquire() as conn:
                    await cli_vaults.operator_claim(conn, vault, force=force)
                issued = await create_code(
                    pool, vault, label=label, device_bound=True, created_by="cli"
                )
                return issued.code, issued.expires_at.isoformat(timespec="seconds")
            except cli_vaults.AccountOwnedError as exc:
                raise CliError(str(exc).replace("a key", "a pairing code")) from None
            except TooManyCodesError:
                raise CliError(
                    f"vault {vault} already has 5 unused pairing codes; wait for them to expire"
                ) from None
            finally:
                await pool.close()

        code, expires = asyncio.run(go())
    err.print(f"pairing code for vault {vault}, single use, valid until {expires}:")
    out.print(code)


@app.command()
def stats(database_url: DatabaseUrl = None, data_dir: DataDir = None) -> None:
    """Vaults, blobs, tombstones, devices, keys and database size."""

    async def work(conn: asyncpg.Connection) -> asyncpg.Record:
        row: asyncpg.Record = await conn.fetchrow(
            "SELECT (SELECT count(*) FROM vaults) AS vaults,"
            " (SELECT count(*) FROM blobs WHERE NOT deleted) AS live_blobs,"
            " (SELECT count(*) FROM blobs WHERE deleted) AS tombstones,"
            " (SELECT count(*) FROM devices) AS devices,"
            " (SELECT count(*) FROM devices WHERE revoked_at IS NOT NULL) AS revoked_devices,"
            " (SELECT count(*) FROM api_keys WHERE revoked_at IS NULL) AS active_keys,"
            " pg_database_size(current_database()) AS db_size_bytes"
        )
        return row

    row = run_db(database_url, data_dir, work)
    for name, value in dict(row).items():
        out.print(f"{name}: {value}")


app.command()(ops.backup)
app.command()(ops.restore)


def main() -> None:
    """Entry point: errors are one line and a non-zero exit; `--debug` shows tracebacks."""
    run(app, "engram-relay", err, _report_error)


def _report_error(exc: Exception) -> int:
    if isinstance(exc, CliError | ValueError):
        err.print(f"[red]error:[/red] {exc}")
        return 2
    if isinstance(exc, DatabaseFailureError):  # relay.db.runtime.database: one line, what to do
        err.print(f"[red]error:[/red] {escape(str(exc))} (--debug for details)", highlight=False)
        return 1
    err.print(f"[red]error:[/red] {type(exc).__name__}: {exc}")
    err.print("run again with --debug for the full traceback")
    return 1
