"""Vault grants on the device side (PROTOCOL §13 "Vault ownership", "Grants carry a role";
docs/vault-ownership.md).

A vault id belongs to its first user; another account may mint keys and keep its wrap
there only once an admin of the vault grants it, as a `member` (the default) or an
`admin` (the owner's to give). These are the admin's steps, with the linked vault's admin
API key: :func:`grant` (by email or account id), :func:`grants`, :func:`ungrant` (which
also revokes the account's keys for the vault). Each turns the relay's refusals into one
line saying what to do.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Final, TypeVar

from msgspec import UNSET

from engram_sync.shared_format.login import normalize_email
from engram_sync.shared_format.wire import GrantRole, VaultGrantInfo

from .._errors import DeviceRevokedError, ForbiddenError, RelayError, SyncError
from .._http.account_client import AccountClient
from .._session import VaultSession

FEATURE: Final = "vault-grants"  # in /v1/info `features` on relays with these routes
T = TypeVar("T")


class GrantError(SyncError):
    """A grant step failed; the message says what to do."""


@dataclass(frozen=True)
class Grant:
    """An account let into the vault: it may mint keys and store its wrap there.

    `role`: `member` or `admin`; `admin` too for a grant of a relay without roles (no
    `role` in its answer), where every grant could do what an admin grant does."""

    account_id: str
    email: str
    granted_at: str
    role: str = "member"


@dataclass(frozen=True)
class _Linked:
    server_url: str
    api_key: str
    vault_id: str


def _linked(session: VaultSession) -> _Linked:
    config = session.config
    if not config.vault_id or not config.server_url or not config.api_key:
        raise GrantError(
            "this vault is not linked to a relay: run `engram-sync link --relay URL ...` "
            "with an admin key first"
        )
    return _Linked(config.server_url, config.api_key, config.vault_id)


def _by_email(who: str) -> bool:
    return "@" in who


@contextmanager
def _refusals(relay: AccountClient, linked: _Linked, who: str | None = None) -> Iterator[None]:
    """Relay refusals of the grant routes as GrantError with what to do."""
    vault_id = linked.vault_id
    try:
        yield
    except DeviceRevokedError:
        raise
    except ForbiddenError as exc:
        if exc.code == "owner_only":  # PROTOCOL §13 "Grants carry a role"
            raise GrantError(
                f"only the owner of vault {vault_id} may give or take back the admin role, or "
                "remove an admin's grant, and this device's key is an admin grant's: run this "
                "on an owner's device"
            ) from None
        if exc.code == "admin_not_granted":
            raise GrantError(
                f"this device's key belongs to an account with a member grant of vault "
                f"{vault_id}, so it cannot manage grants: ask the vault's owner for an admin "
                "grant (`engram-sync team grant --admin EMAIL` on the owner's device)"
            ) from None
        raise GrantError(
            f"grants of vault {vault_id} need an admin key for it, and this device's key is "
            f"not one ({exc.message}): run this on an admin's device, or ask the relay's "
            f"operator (`engram-relay vaults grant {vault_id} EMAIL`)"
        ) from None
    except RelayError as exc:
        if exc.status == 404 and exc.code == "no_account":
            raise GrantError(
                f"the relay at {linked.server_url} has no account {who}: its owner signs up "
                f"first (`engram-sync account signup --relay {linked.server_url}`), then run "
                "this again"
            ) from None
        if exc.status in (404, 405) and not _offers_grants(relay):
            raise GrantError(
                f"the relay at {linked.server_url} does not offer vault grants (no "
                f"`{FEATURE}` in its /v1/info features): ask its operator to upgrade it, or "
                f"to run `engram-relay vaults grant {vault_id} EMAIL`"
            ) from None
        if exc.status == 400:
            raise GrantError(f"the relay refused: {exc.message}") from None
        raise


def _offers_grants(relay: AccountClient) -> bool:
    try:
        return FEATURE in relay.info().features
    except SyncError:
        return False


def _with_relay(
    session: VaultSession, who: str | None, step: Callable[[AccountClient, str], T]
) -> T:
    linked = _linked(session)
    with (
        AccountClient(
            linked.server_url, linked.api_key, device_id=session.device.device_id
        ) as relay,
        _refusals(relay, linked, who),
    ):
        return step(relay, linked.vault_id)


def _grant(info: VaultGrantInfo) -> Grant:
    role = "admin" if info.role is UNSET else info.role  # a relay without roles: see Grant
    return Grant(info.account_id, info.email, info.granted_at, role)


def grant(session: VaultSession, who: str, *, admin: bool = False) -> Grant:
    """Grant the linked vault to the account with email (or account id) `who` (idempotent),
    as an admin with `admin` (the owner's to give), else as a member: a repeat sets the role.
    """
    who = who.strip()
    if not who:
        raise GrantError("name the account by its email (or its account id, acct_…)")
    role: GrantRole = "admin" if admin else "member"

    def step(relay: AccountClient, vault_id: str) -> Grant:
        if _by_email(who):
            return _grant(relay.grant_vault(vault_id, email=who, role=role))
        return _grant(relay.grant_vault(vault_id, account_id=who, role=role))

    return _with_relay(session, who, step)


def grants(session: VaultSession) -> list[Grant]:
    """The accounts granted the linked vault, oldest first (admin key)."""
    return _with_relay(
        session,
        None,
        lambda relay, vault_id: [_grant(g) for g in relay.vault_grants(vault_id).grants],
    )


def ungrant(session: VaultSession, who: str) -> Grant:
    """Remove the grant of the account with email or account id `who`; the removed grant.

    The grant is looked up in the list first, so an email works and a typo is an error
    rather than a silent no-op. The relay revokes the keys the account minted for the
    vault with it (PROTOCOL §13).
    """
    who = who.strip()

    def step(relay: AccountClient, vault_id: str) -> Grant:
        listed = [_grant(g) for g in relay.vault_grants(vault_id).grants]
        if _by_email(who):
            found = [g for g in listed if normalize_email(g.email) == normalize_email(who)]
        else:
            found = [g for g in listed if g.account_id == who]
        if not found:
            raise GrantError(
                f"vault {vault_id} has no grant for {who}: `engram-sync team grants` lists them"
            )
        # revoked may be false when a retry followed a lost answer: gone either way.
        relay.revoke_vault_grant(vault_id, found[0].account_id)
        return found[0]

    return _with_relay(session, who, step)
