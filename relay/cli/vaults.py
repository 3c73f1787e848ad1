"""`engram-relay vaults`: list and show vaults, set a vault's quota, grant accounts, retire.

Also the operator side of vault ownership (PROTOCOL §13, docs/vault-ownership.md):
minting a key (`keys create`, `pair`) or serving a static key for a vault an account
owns stops and says so, unless the operator insists (`--force`; static keys: mint
a key with `keys create --force` instead).
"""

from __future__ import annotations

import logging
import os
import sys
from collections.abc import Sequence
from datetime import timedelta
from typing import Annotated, Any

import asyncpg
import typer
from rich.console import Console
from rich.table import Table

from engram_sync.relay.cli.options import DatabaseUrl, DataDir
from engram_sync.relay.cli.support import CliError, check_vault, on_connection, run_db
from engram_sync.relay.domain.api_keys import StaticKey
from engram_sync.relay.domain.domain_errors import AlreadyRetiredError
from engram_sync.relay.domain.grant_roles import ADMIN, MEMBER, Role
from engram_sync.relay.services.config import DEFAULT_RETIRE_GRACE_DAYS
from engram_sync.relay.store import minted_keys as key_store
from engram_sync.relay.store import owners
from engram_sync.relay.store import retire as retirement
from engram_sync.relay.store.owners import VaultOwner

log = logging.getLogger("engram_sync.relay.cli.main")
vaults_app = typer.Typer(
    help="List vaults, show one, set its quota, grant accounts, retire one.",
    no_args_is_help=True,
)
out = Console(soft_wrap=True, width=None if sys.stdout.isatty() else 240)

ACCOUNT_ID_SHOWN = 13  # "acct_" + 8 hex digits
VaultId = Annotated[str, typer.Argument(help="Vault id.")]
Account = Annotated[str, typer.Argument(help="The account's email (or account id).")]


class AccountOwnedError(Exception):
    """The operator is about to mint a key into a vault an account owns."""

    def __init__(self, message: str, owner: VaultOwner) -> None:
        super().__init__(message)
        self.owner = owner


def account_prefix(account_id: str | None) -> str:
    """An account id shortened for a one-line message."""
    return (account_id or "")[:ACCOUNT_ID_SHOWN] + "…"


# --- the operator side of ownership (used by `keys create`, `pair` and `serve`) ------------


async def operator_claim(conn: asyncpg.Connection, vault_id: str, *, force: bool) -> VaultOwner:
    """Claim the vault for the operator if unused (PROTOCOL §13); AccountOwnedError when
    an account owns it, unless `force`."""
    found = await owners.claim(conn, vault_id, None)
    if found.account_id is not None and not force:
        raise AccountOwnedError(
            f"vault {vault_id} is owned by an account (id prefix "
            f"{account_prefix(found.account_id)}); pass --force to mint a key anyway",
            found,
        )
    return found


async def mint_operator_key(
    conn: asyncpg.Connection,
    *,
    vault_id: str,
    force: bool,
    is_admin: bool,
    device_id: str | None,
    rate: int,
    label: str | None,
) -> tuple[str, str, VaultOwner]:
    """`keys create`: (key id, key, owner); the claim and the key are one transaction."""
    async with conn.transaction():
        found = await operator_claim(conn, vault_id, force=force)
        key_id, key = await key_store.create_key(
            conn, vault_id=vault_id, is_admin=is_admin, device_id=device_id, rate=rate, label=label
        )
    return key_id, key, found


async def claim_static_vaults(url: str, static_keys: Sequence[StaticKey]) -> list[str]:
    """At start-up, claim the vaults named in SYNC_API_KEYS for the operator; one line per
    vault an account owns (the relay then refuses to start, see docs/vault-ownership.md)."""
    named = sorted({v for k in static_keys if k.principal.vaults for v in k.principal.vaults})
    if not named:
        return []

    async def claim(conn: asyncpg.Connection) -> list[asyncpg.Record]:
        async with conn.transaction():
            await owners.claim_operator(conn, named)
            found: list[asyncpg.Record] = await conn.fetch(
                "SELECT vault_id, account_id FROM vault_owners"
                " WHERE vault_id = ANY($1::text[]) AND owner = 'account' ORDER BY vault_id",
                named,
            )
            return found

    rows = await on_connection(url, claim)
    problems = []
    for r in rows:
        log.warning(
            "static key names an account-owned vault",
            extra={"vault_id": r["vault_id"], "account": account_prefix(r["account_id"])},
        )
        problems.append(
            f"SYNC_API_KEYS names vault {r['vault_id']}, which is owned by an account (id prefix "
            f"{account_prefix(r['account_id'])}); remove it from SYNC_API_KEYS, or mint a key "
            f"with `engram-relay keys create --vault {r['vault_id']} --force`"
        )
    return problems


# --- vaults list / show ------------------------------------------------------------------------

_VAULTS = """
    SELECT ids.vault_id, coalesce(v.live_blobs, 0) AS blobs, coalesce(v.tombstones, 0) AS dead,
           coalesce(v.bytes_used, 0) AS bytes, coalesce(v.seq, 0) AS seq,
           (SELECT count(*) FROM devices d
            WHERE d.vault_id = ids.vault_id AND d.revoked_at IS NULL) AS devices,
           (SELECT count(*) FROM devices d
            WHERE d.vault_id = ids.vault_id AND d.revoked_at IS NOT NULL) AS revoked_devices,
           (SELECT b.received_at FROM blobs b WHERE b.vault_id = ids.vault_id
            ORDER BY b.seq DESC LIMIT 1) AS last_push,
           o.owner, o.account_id, o.claimed_at, a.email, q.max_bytes, q.max_devices,
           v.scrubbed_at, coalesce(v.scrub_mismatches, 0) AS scrub_mismatches
    FROM (SELECT vault_id FROM vaults UNION SELECT vault_id FROM vault_owners
          UNION SELECT vault_id FROM quotas) ids
    LEFT JOIN vaults v ON v.vault_id = ids.vault_id
    LEFT JOIN vault_owners o ON o.vault_id = ids.vault_id
    LEFT JOIN accounts a ON a.id = o.account_id
    LEFT JOIN quotas q ON q.vault_id = ids.vault_id
"""


def _owner_text(row: asyncpg.Record, *, email: bool = False) -> str:
    if row["owner"] is None:
        return "(nobody yet)"
    if row["owner"] == owners.OPERATOR:
        return "operator"
    text = f"account {row['account_id']}"
    return f"{text} <{row['email']}>" if email else text


def _limit(value: int | None) -> str:
    if value is None:
        return "default"
    return "unlimited" if value == 0 else str(value)


def _quota_text(row: asyncpg.Record) -> str:
    if row["max_bytes"] is None and row["max_devices"] is None:
        return "default"
    return f"bytes {_limit(row['max_bytes'])}, devices {_limit(row['max_devices'])}"


def _when(value: Any) -> str:
    return "" if value is None else str(value.isoformat(timespec="seconds"))


@vaults_app.command("list")
def vaults_list(database_url: DatabaseUrl = None, data_dir: DataDir = None) -> None:
    """Every vault: live blobs, bytes, active devices, last push (newest stored blob), owner,
    quota override."""
    rows = run_db(database_url, data_dir, lambda c: c.fetch(_VAULTS + " ORDER BY ids.vault_id"))
    table = Table("vault", "blobs", "bytes", "devices", "last push", "owner", "quota")
    for r in rows:
        table.add_row(
            r["vault_id"],
            str(r["blobs"]),
            str(r["bytes"]),
            str(r["devices"]),
            _when(r["last_push"]),
            _owner_text(r),
            _quota_text(r),
        )
    out.print(table)


@vaults_app.command("show")
def vaults_show(
    vault: VaultId,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """One vault: counts, owner, quota, keys and the accounts granted it."""
    check_vault(vault)

    async def work(
        c: asyncpg.Connection,
    ) -> tuple[asyncpg.Record | None, asyncpg.Record, list[owners.Grant]]:
        row = await c.fetchrow(_VAULTS + " WHERE ids.vault_id = $1", vault)
        keys = await c.fetchrow(
            "SELECT count(*) FILTER (WHERE account_id IS NULL) AS operator,"
            " count(*) FILTER (WHERE account_id IS NOT NULL) AS account"
            " FROM api_keys WHERE vault_id = $1 AND revoked_at IS NULL",
            vault,
        )
        return row, keys, await owners.grants(c, vault)

    row, keys, grants = run_db(database_url, data_dir, work)
    if row is None:
        raise CliError(f"no vault {vault!r} on this relay; see `engram-relay vaults list`")
    lines = {
        "vault": row["vault_id"],
        "owner": _owner_text(row, email=True),
        "claimed": _when(row["claimed_at"]),
        "blobs": row["blobs"],
        "tombstones": row["dead"],
        "bytes": row["bytes"],
        "seq": row["seq"],
        "devices": row["devices"],
        "revoked devices": row["revoked_devices"],
        "last push": _when(row["last_push"]) or "never",
        "quota bytes": _limit(row["max_bytes"]),
        "quota devices": _limit(row["max_devices"]),
        "active keys": f"{keys['operator']} operator, {keys['account']} account",
        # relay.store.scrub (issue 35): the stored digest recomputed from the rows
        "last scrub": _when(row["scrubbed_at"]) or "never",
        "scrub mismatches": row["scrub_mismatches"],
    }
    for name, value in lines.items():
        out.print(f"{name}: {value}", highlight=False)
    if grants:
        table = Table("granted account", "email", "role", "granted by", "granted")
        for g in grants:
            table.add_row(g.account_id, g.email, g.role, g.granted_by, _when(g.granted_at))
        out.print(table)
    else:
        out.print("grants: none", highlight=False)


# --- vaults quota ------------------------------------------------------------------------------


def _parse_limit(value: str | None, option: str) -> tuple[bool, int | None]:
    """(given, value): a number >= 0 (0 = unlimited), or `default` (None: the relay's)."""
    if value is None:
        return False, None
    if value.strip().lower() == "default":
        return True, None
    try:
        number = int(value)
    except ValueError:
        raise CliError(
            f"{option} must be a whole number >= 0 or `default`, not {value!r}"
        ) from None
    if number < 0:
        raise CliError(f"{option} must be >= 0 (0 = unlimited) or `default`, not {number}")
    return True, number


@vaults_app.command("quota")
def vaults_quota(
    vault: VaultId,
    max_bytes: Annotated[
        str | None,
        typer.Option(
            "--bytes",
            help="Max stored ciphertext bytes: a number (0 = unlimited) or `default` "
            "(the relay's ENGRAM_RELAY_QUOTA_BYTES).",
        ),
    ] = None,
    max_devices: Annotated[
        str | None,
        typer.Option(
            "--devices",
            help="Max devices: a number (0 = unlimited) or `default` "
            "(the relay's ENGRAM_RELAY_QUOTA_DEVICES).",
        ),
    ] = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Set a vault's quota; the next push and device registration are judged by it."""
    check_vault(vault)
    set_bytes, bytes_value = _parse_limit(max_bytes, "--bytes")
    set_devices, devices_value = _parse_limit(max_devices, "--devices")
    if not set_bytes and not set_devices:
        raise CliError("give --bytes and/or --devices (a number, 0 = unlimited, or `default`)")

    async def work(c: asyncpg.Connection) -> asyncpg.Record:
        async with c.transaction():
            row: asyncpg.Record = await c.fetchrow(
                "INSERT INTO quotas (vault_id, max_bytes, max_devices) VALUES ($1, $2, $4)"
                " ON CONFLICT (vault_id) DO UPDATE SET"
                " max_bytes = CASE WHEN $3 THEN EXCLUDED.max_bytes ELSE quotas.max_bytes END,"
                " max_devices = CASE WHEN $5 THEN EXCLUDED.max_devices"
                " ELSE quotas.max_devices END"
                " RETURNING max_bytes, max_devices",
                vault,
                bytes_value,
                set_bytes,
                devices_value,
                set_devices,
            )
            await c.execute(
                "DELETE FROM quotas WHERE vault_id = $1 AND max_bytes IS NULL"
                " AND max_devices IS NULL",
                vault,
            )
            return row

    row = run_db(database_url, data_dir, work)
    out.print(
        f"vault {vault} quota: bytes {_limit(row['max_bytes'])}, "
        f"devices {_limit(row['max_devices'])}",
        highlight=False,
    )


# --- vaults grant / ungrant ----------------------------------------------------------------------


async def _account_id(conn: asyncpg.Connection, account: str) -> str:
    """The id of the account with that email or id, or CliError."""
    found = await owners.account_by_email_or_id(conn, account)
    if found is None:
        raise CliError(f"no account with email or id {account!r} on this relay")
    return found[0]


@vaults_app.command("grant")
def vaults_grant(
    vault: VaultId,
    account: Account,
    admin: Annotated[
        bool,
        typer.Option(
            "--admin",
            help="An admin grant: the account may also mint admin keys, grant others "
            "(member) and revoke devices. Without it, a member grant (or an admin grant "
            "turned back into one).",
        ),
    ] = False,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Let an account mint keys and store its wrap for a vault it does not own.

    A vault nobody has used yet is claimed for the operator first (granting is operator use).
    The operator may give either role (PROTOCOL §13 "Grants carry a role").
    """
    check_vault(vault)
    role: Role = ADMIN if admin else MEMBER

    async def work(c: asyncpg.Connection) -> tuple[str, VaultOwner]:
        async with c.transaction():
            account_id = await _account_id(c, account)
            owner = await owners.claim(c, vault, None)
            if owner.account_id != account_id:
                await owners.grant(c, vault, account_id, "cli", role)
            return account_id, owner

    account_id, owner = run_db(database_url, data_dir, work)
    if owner.account_id == account_id:
        out.print(f"account {account_id} owns vault {vault} already", highlight=False)
    else:
        out.print(f"account {account_id} granted vault {vault} ({role})", highlight=False)


@vaults_app.command("ungrant")
def vaults_ungrant(
    vault: VaultId,
    account: Account,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Remove a grant: no new keys or wraps for that account, and every key it minted for
    the vault is revoked (PROTOCOL §13)."""
    check_vault(vault)

    async def work(c: asyncpg.Connection) -> tuple[str, bool]:
        account_id = await _account_id(c, account)
        return account_id, await owners.revoke_grant(c, vault, account_id)

    account_id, removed = run_db(database_url, data_dir, work)
    if not removed:
        raise CliError(
            f"account {account_id} has no grant for vault {vault}; see `vaults show {vault}`"
        )
    out.print(f"grant of vault {vault} to account {account_id} removed", highlight=False)


@vaults_app.command("retire")
def vaults_retire(
    vault: VaultId,
    successor: Annotated[
        str | None, typer.Option(help="The vault id devices should move to (a hint).")
    ] = None,
    grace_days: Annotated[
        int | None,
        typer.Option(
            min=0, max=3650, help="Days pulls keep working (default ENGRAM_RETIRE_GRACE_DAYS, 30)."
        ),
    ] = None,
    database_url: DatabaseUrl = None,
    data_dir: DataDir = None,
) -> None:
    """Retire a vault after a re-key (PROTOCOL §19, docs/rekey.md): every push to it is
    refused 410 from now on; pulls work for the grace period, then its blobs are erased.
    Idempotent; another successor than the stored one is refused."""
    check_vault(vault)
    if successor is not None:
        check_vault(successor)
        if successor == vault:
            raise CliError("a vault cannot be its own successor")
    days = grace_days
    if days is None:
        raw = os.environ.get("ENGRAM_RETIRE_GRACE_DAYS", "").strip()
        days = int(raw) if raw.isdigit() else DEFAULT_RETIRE_GRACE_DAYS
        if raw and not raw.isdigit():
            raise CliError(f"ENGRAM_RETIRE_GRACE_DAYS must be a whole number of days, got {raw!r}")

    async def work(c: asyncpg.Connection) -> retirement.Retirement:
        return await retirement.retire_on(c, vault, successor, timedelta(days=days))

    try:
        done = run_db(database_url, data_dir, work)
    except AlreadyRetiredError as exc:
        raise CliError(
            f"vault {vault} was already retired with successor {exc.successor or 'none'}"
        ) from None
    out.print(
        f"vault {vault} retired (successor {done.successor or 'none'}); "
        f"retired at {done.retired_at.isoformat()}, blobs erased after "
        f"{done.erase_after.isoformat()}",
        highlight=False,
    )
