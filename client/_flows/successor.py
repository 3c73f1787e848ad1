"""Moving this device to the successor of a retired vault (PROTOCOL §19; docs/rekey.md
"Other devices"): `engram-sync rekey --join`, and the automatic switch of an account vault.

The relay's successor is only a hint (client._sync.retirement). This device follows it only
when the successor statement the relay handed back verifies under the OLD vault's hmac key
(§19 last bullet: a relay could otherwise name any other vault the account can open, e.g.
a team vault, and have this device copy a private vault into it), checked before anything
is minted, fetched or pushed; without a valid statement it stops, names both vault ids and
asks (a `confirm` callback: a terminal prompt), or follows a successor the person named
(`named`: `rekey --join --successor ID`). It switches only with a K it obtained itself,
and only when the successor's blobs (if it holds any) verify under that K (defence in
depth, §14):

- a passphrase vault: the person's new passphrase gives K and the vault id (§2); an id that
  is not the relay's hint needs the person's confirmation (or `force`);
- an account vault: the successor's wrap from the account (§13), unwrapped with A, its
  vault_id suffix equal to the successor, and a key minted for it;
- a team vault: the device is pointed at the successor with its key expected from the
  handoff (§14): nothing is pushed or pulled until `team request` brought an authenticated K.

The switch keeps every local memory, every unpushed edit and the known clocks; the state
starts from cursor 0 with a link pull (client._sync.state.bind), so the next sync pulls the
successor and pushes every version it lacks, the unpushed edits with new clocks above all
it has seen. A passphrase vault's engrams.db is rekeyed to the new passphrase last (VAULT
§2); K is stored for the successor first, so a crash anywhere leaves a device that syncs
the vault its config names with that vault's keys, and running the join again finishes it.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from engram_sync.shared_format.b64 import Base64Error, b64decode_std
from engram_sync.shared_format.errors import KeyUnwrapError
from engram_sync.shared_format.successor_statement import statement_verifies
from engram_sync.shared_format.sync_keys import SyncKeys, derive_sync_keys, vault_id_v2
from engram_sync.shared_format.vault import sqlcipher
from engram_sync.shared_format.vault.salt import vault_salt16
from engram_sync.shared_format.vault.sqlcipher_key import passphrase_vault_key
from engram_sync.shared_format.wraps import unwrap_vault_key

from .._accounts import account as account_ops
from .._accounts.pairing import require_passphrase_vault, save_link
from .._errors import AuthError, ForbiddenError, RelayError, SyncError
from .._http.relay_client import RelayClient
from .._session import VaultSession
from .._vault.store import count_to_push
from .._vault.vault_key_store import (
    expect_vault_key,
    key_source,
    keys_open_relay_blobs,
    pack_keys,
    store_vault_key,
)

log = logging.getLogger(__name__)

#: Asked when the new vault id is not the relay's hint: True to switch anyway.
Confirm = Callable[[str], bool]


class JoinError(SyncError):
    """The switch to a successor was refused; nothing was switched. The message says why."""


class UnprovenSuccessorError(JoinError):
    """PROTOCOL §19: the relay names a successor without a successor statement that verifies
    under the old vault's hmac key; nothing was minted, fetched, pushed or switched."""

    def __init__(self, old: str, successor: str) -> None:
        self.old_vault_id, self.successor = old, successor
        super().__init__(unproven_message(old, successor) + "; " + confirm_hint(successor))


def unproven_what(old: str, successor: str) -> str:
    """What is wrong, naming both vault ids."""
    return (
        f"the relay says vault {old} was replaced by vault {successor}, but without a successor "
        f"statement made with vault {old}'s key (PROTOCOL §19): a relay can name any other "
        "vault you can open, so this device does not follow it by itself"
    )


def unproven_message(old: str, successor: str) -> str:
    """`unproven_what`, and that nothing happened (one line)."""
    return unproven_what(old, successor) + "; nothing was switched or pushed"


def confirm_hint(successor: str) -> str:
    """How the person follows it anyway, having checked it is the re-key."""
    return (
        f"if you know {successor} is the re-key of this vault, run `engram-sync rekey --join "
        f"--successor {successor}`"
    )


@dataclass
class JoinReport:
    """What `rekey --join` did (`--json`)."""

    old_vault_id: str
    new_vault_id: str
    source: str  # where K came from: passphrase, account or handoff
    hint: str | None  # the relay's successor (a hint)
    hint_matched: bool
    successor_verified: bool | None  # its blobs verify under K; None: it holds none (yet)
    # PROTOCOL §19: the successor statement verified under the old vault's hmac key (False:
    # followed on the person's word, `--successor`, `--force` or a confirmation)
    statement_verified: bool = False
    db_rekeyed: bool = False
    pending: int = 0  # unpushed changes the next sync pushes to the successor
    waiting_for_key: bool = False  # a team vault: K comes with `team request`
    already: bool = False  # this device had switched already (a join run again)


def successor_hint(session: VaultSession) -> str | None:
    """The successor the relay named for the linked vault, if it said it was retired."""
    hint = session.state.retired
    if hint is None or hint.vault_id != session.config.vault_id:
        return None
    return hint.successor


def successor_proved(session: VaultSession, successor: str) -> bool:
    """PROTOCOL §19 last bullet: the relay's successor statement for the linked (old) vault
    names `successor` and verifies under the old vault's hmac key, which this device holds
    (its session keys until it switches)."""
    hint = session.state.retired
    old = session.config.vault_id
    if hint is None or not old or hint.vault_id != old or hint.successor != successor:
        return False
    return statement_verifies(session.keys.hmac_key, old, successor, hint.stated_at, hint.statement)


def may_follow(proved: bool, successor: str, *, named: str | None, confirmed: bool) -> bool:
    """The decision (PROTOCOL §19): follow a proved successor, or one the person named or
    confirmed; `named` another vault is never a confirmation of this one."""
    return proved or named == successor or (named is None and confirmed)


def _require_proof(
    session: VaultSession, old: str, successor: str, named: str | None, confirm: Confirm | None
) -> bool:
    """Whether the statement verified; `UnprovenSuccessorError` when it does not and the
    person neither named this successor nor confirmed it. Runs before anything is minted,
    fetched or pushed for the successor."""
    proved = successor_proved(session, successor)
    if proved or named is not None:
        if not may_follow(proved, successor, named=named, confirmed=False):
            raise JoinError(
                f"you named vault {named} as the successor of vault {old}, but the relay names "
                f"{successor}: nothing was switched; check the vault id"
            )
        return proved
    asked = confirm is not None and confirm(unproven_what(old, successor))
    if not may_follow(proved, successor, named=None, confirmed=asked):
        raise UnprovenSuccessorError(old, successor)
    return False


def _linked(session: VaultSession) -> tuple[str, str]:
    vault_id, server_url = session.config.vault_id, session.config.server_url
    if not vault_id or not server_url:
        raise JoinError("this vault is not linked to a relay: run `engram-sync link` first")
    return server_url, vault_id


def _pending(session: VaultSession) -> int:
    rows, tombstones = count_to_push(session.vault.conn)
    return rows + tombstones


def _verify_successor(
    session: VaultSession, server_url: str, api_key: str | None, vault_id: str, keys: SyncKeys
) -> bool | None:
    """PROTOCOL §14 defence in depth: the successor's oldest blobs verify under K (None: it
    holds none). A K under which none verifies is refused loudly, nothing switched."""
    try:
        with RelayClient(server_url, api_key, device_id=session.device.device_id) as relay:
            verified = keys_open_relay_blobs(relay, vault_id, keys)
            relay.register_device(vault_id, session.device.device_id, session.device.label)
    except (AuthError, ForbiddenError) as exc:
        raise JoinError(
            f"the relay refused this device's API key for the new vault {vault_id} "
            f"({exc.code}): pass a key for it (ENGRAM_NEW_API_KEY, or ask an admin); nothing "
            "was switched"
        ) from None
    if verified is False:
        raise JoinError(
            f"the blobs of vault {vault_id} on the relay do not verify under the new key: it is "
            "not this vault's successor (a wrong passphrase, or a relay pointing this device "
            "at a vault that is not its own); nothing was switched, this device's memories and "
            "unpushed changes are unchanged"
        )
    return verified


def _switch(
    session: VaultSession,
    server_url: str,
    vault_id: str,
    api_key: str,
    keys: SyncKeys | None,
    source: str,
) -> None:
    """Point the device at the successor: K first (so the next command keys the successor
    with it whatever opened engrams.db), then config and state (cursor 0, a link pull:
    everything the successor lacks is pushed), the known clocks kept."""
    old = session.config.vault_id
    with session.vault.transaction() as conn:
        if keys is not None:
            store_vault_key(conn, pack_keys(keys, vault_id), source)
        else:
            expect_vault_key(conn, vault_id, source)  # a team vault: K from the handoff
    save_link(session, server_url, api_key, vault_id)
    session.state.rekeyed_from = old
    session.state.last_error = None
    session.state.save()
    if keys is None:
        session.forget_keys()  # K comes with the handoff
    else:
        session.set_keys(keys)
    log.info("switched from retired vault %s to its successor %s (%s)", old, vault_id, source)


def _rekey_database(session: VaultSession, new_passphrase: str) -> bool:
    """VAULT §2: engrams.db keyed by the new passphrase (same salt); False when it is."""
    if session.passphrase == new_passphrase:
        return False
    key = passphrase_vault_key(new_passphrase, vault_salt16(session.path))
    sqlcipher.rekey(session.vault.conn, key)
    session.passphrase = new_passphrase
    return True


# long: PROTOCOL §19's follower checks in their order, each refusing with its own message
def join_with_passphrase(
    session: VaultSession,
    new_passphrase: str,
    *,
    api_key: str | None = None,
    force: bool = False,
    confirm: Confirm | None = None,
    named: str | None = None,
) -> JoinReport:
    """A passphrase vault: the new passphrase gives K and the vault id (PROTOCOL §2); the
    relay's successor statement must name that id and verify under the old keys (§19), else
    the person confirms (`confirm`), passes `force` or names the id (`named`)."""
    require_passphrase_vault(session)
    server_url, old = _linked(session)
    if not new_passphrase:
        raise JoinError("the new passphrase must not be empty")
    new_id = vault_id_v2(new_passphrase)
    if old == new_id:
        if session.state.rekeyed_from is None:
            raise JoinError(
                f"this passphrase gives vault {old}, the one this device syncs already: enter "
                "the new passphrase the vault was re-keyed to"
            )
        report = JoinReport(session.state.rekeyed_from, new_id, "passphrase", None, True, None)
        report.already = True
        report.db_rekeyed = _rekey_database(session, new_passphrase)  # a join cut short
        report.pending = _pending(session)
        return report
    hint = successor_hint(session)
    if named is not None and named != new_id:
        raise JoinError(
            f"the new passphrase gives vault {new_id}, not {named}: check the new passphrase "
            "or the vault id; nothing was switched"
        )
    # PROTOCOL §19: checked with the old keys this device holds, before anything is pushed
    proved = successor_proved(session, new_id)
    if not proved:
        if hint != new_id:
            what = (
                f"the relay names {hint} as the successor of vault {old}, but the new "
                f"passphrase gives vault {new_id}"
                if hint
                else f"the relay has not said that vault {old} was retired (or named no "
                f"successor); the new passphrase gives vault {new_id}"
            )
        else:
            what = unproven_what(old, new_id)
        confirmed = force or named == new_id or (confirm is not None and confirm(what))
        if not confirmed:
            raise JoinError(
                f"{what}: check the new passphrase, or pass --force (or --successor {new_id}) "
                f"to switch to {new_id} anyway; nothing was switched"
            )
    keys = derive_sync_keys(new_passphrase)
    key = api_key or session.config.api_key
    if not key:
        raise JoinError("this vault has no API key: run `engram-sync link` first")
    verified = _verify_successor(session, server_url, key, new_id, keys)
    _switch(session, server_url, new_id, key, keys, "passphrase")
    report = JoinReport(old, new_id, "passphrase", hint, hint == new_id, verified, proved)
    report.db_rekeyed = _rekey_database(session, new_passphrase)
    report.pending = _pending(session)
    return report


def _target(old: str, hint: str | None, named: str | None, missing: str) -> str:
    successor = named or hint
    if successor is None:
        raise JoinError(missing)
    if successor == old:
        raise JoinError(f"vault {old} cannot be its own successor: nothing was switched")
    return successor


def join_with_account(
    session: VaultSession,
    password: str,
    *,
    named: str | None = None,
    confirm: Confirm | None = None,
) -> JoinReport:
    """An account vault: K of the successor from the account (PROTOCOL §13), unwrapped with
    A, its vault_id suffix the successor's; a key minted for it, bound to this device. The
    successor statement is checked first (§19), before the account is even unlocked."""
    server_url, old = _linked(session)
    relay_named = successor_hint(session)
    hint = _target(
        old,
        relay_named,
        named,
        f"the relay has not named a successor of vault {old}: an account vault follows only "
        "a successor the relay names and the account holds the key of; run `engram-sync "
        "sync` to ask the relay again",
    )
    proved = _require_proof(session, old, hint, named, confirm)
    unlocked = account_ops.unlock(session.path, password)
    device = session.device
    with unlocked.client() as relay:
        try:
            wrap = relay.vault_wrap(hint)
        except RelayError as exc:
            if exc.status != 404:
                raise
            raise JoinError(
                f"your account holds no key for vault {hint} (yet): the re-key may still be "
                "running on the other device; run `engram-sync sync` again later"
            ) from None
        try:
            k = unwrap_vault_key(b64decode_std(wrap.wrapped_k), unlocked.account_key, hint)
        except (KeyUnwrapError, Base64Error):
            raise JoinError(
                f"the key your account holds for vault {hint} does not open with your account "
                "key or names another vault: refused, nothing was switched"
            ) from None
        keys = SyncKeys(enc_key=k.enc_key, hmac_key=k.hmac_key)
        minted = relay.mint_key(hint, device_id=device.device_id, label=device.label)
    verified = _verify_successor(session, server_url, minted.key, hint, keys)
    _switch(session, server_url, hint, minted.key, keys, "account")
    report = JoinReport(old, hint, "account", relay_named, hint == relay_named, verified)
    report.statement_verified = proved
    report.pending = _pending(session)
    return report


def join_with_handoff(
    session: VaultSession,
    *,
    api_key: str | None = None,
    named: str | None = None,
    confirm: Confirm | None = None,
) -> JoinReport:
    """A team vault: point the device at the successor with its K expected from the handoff
    (PROTOCOL §14); `team request` brings K (authenticated, checked against the successor's
    blobs), and until then no sync pushes or pulls anything. The successor statement is
    checked first under the team vault's old key (§19)."""
    server_url, old = _linked(session)
    relay_named = successor_hint(session)
    hint = _target(
        old,
        relay_named,
        named,
        f"the relay has not named a successor of vault {old}: ask a team admin for the new "
        "vault id and link to it (`engram-sync link --code CODE`)",
    )
    proved = _require_proof(session, old, hint, named, confirm)
    key = api_key or session.config.api_key
    if not key:
        raise JoinError("this vault has no API key: run `engram-sync link` first")
    try:
        with RelayClient(server_url, key, device_id=session.device.device_id) as relay:
            relay.register_device(hint, session.device.device_id, session.device.label)
    except (AuthError, ForbiddenError) as exc:
        raise JoinError(
            f"the relay refused this device's API key for the new vault {hint} ({exc.code}): "
            "ask a team admin for a pairing code for it (`engram-sync link --code CODE`)"
        ) from None
    _switch(session, server_url, hint, key, None, "handoff")
    report = JoinReport(
        old, hint, "handoff", relay_named, hint == relay_named, None, proved,
        waiting_for_key=True,
    )  # fmt: skip
    report.pending = _pending(session)
    return report


def join_kind(session: VaultSession) -> str:
    """Where the linked vault's key comes from: passphrase, account or handoff."""
    source = key_source(session.vault.conn, session.config.vault_id)
    return "handoff" if source == "missing" else source
