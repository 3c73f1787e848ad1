"""A retired vault, as the other devices meet it (PROTOCOL §19; docs/rekey.md "Other devices").

Another device re-keyed the vault and the relay retired the old one: a push to it is
answered 410 `vault_retired`, every pull page carries `retired`, the live feed sends
`event: retired`. The relay is untrusted, so all of that is only a hint (`RetiredHint`):
this device stops pushing to the vault, keeps every unpushed edit pending (nothing is
dropped or marked pushed), keeps pulling, and tells the person what happened and what to
do. A later pull that no longer says `retired` clears the hint (a relay that lied once
cannot stop this device's pushes for good; they were only delayed). The device moves to
the successor only with a key it obtained itself (client._flows.successor).
"""

from __future__ import annotations

from typing import Final

from engram_sync.shared_format.timestamps import utc_now_rfc3339

from .._errors import VaultRetiredError, statement_hint, vault_id_hint
from .state import RetiredHint, SyncState

SOURCES: Final = ("push", "pull", "events")

# What to do, by where this device's sync keys come from (client._vault.vault_key_store.key_source).
_WHAT_TO_DO: Final = {
    "passphrase": (
        "run `engram-sync rekey --join` and enter the vault's new passphrase (or set "
        "ENGRAM_NEW_PASSPHRASE)"
    ),
    "account": (
        "run `engram-sync sync` or `engram-sync rekey --join` with your account password "
        "(or ENGRAM_ACCOUNT_PASSWORD): the new key comes from your account"
    ),
    "handoff": (
        "run `engram-sync rekey --join`, then `engram-sync team request` and have an admin "
        "approve it: the new key comes through the team handoff"
    ),
}


def note_retired(
    state: SyncState,
    vault_id: str,
    *,
    successor: object,
    erase_after: object = None,
    source: str,
    statement: object = None,
    stated_at: object = None,
) -> RetiredHint:
    """Remember the relay's word that `vault_id` is retired (the newest word wins), with
    the successor statement it handed back (PROTOCOL §19; checked only when followed)."""
    if source not in SOURCES:
        raise ValueError(f"source must be one of {', '.join(SOURCES)}")
    hint = RetiredHint(
        vault_id=vault_id,
        successor=vault_id_hint(successor),
        erase_after=erase_after if isinstance(erase_after, str) else None,
        source=source,
        seen_at=utc_now_rfc3339(),
        statement=statement_hint(statement),
        stated_at=statement_hint(stated_at),
    )
    if hint.successor == vault_id:
        hint.successor = None  # a vault is never its own successor
    kept = state.retired
    if kept is not None and kept.vault_id == vault_id and hint.erase_after is None:
        hint.erase_after = kept.erase_after  # a push's 410 does not say it; the pull did
    state.retired = hint
    return hint


def retired_message(hint: RetiredHint, *, pending: int, key_source: str) -> str:
    """One line for the person: what happened, that nothing was lost, and what to do."""
    successor = (
        f" (the relay names {hint.successor} as the new vault)"
        if hint.successor
        else " (the relay names no new vault)"
    )
    erase = (
        f"; the relay keeps the old vault readable until {hint.erase_after}"
        if (hint.erase_after)
        else ""
    )
    kept = (
        f"this device's {pending} unpushed change(s) are kept here and will be pushed to the "
        "new vault"
        if pending
        else "this device has no unpushed changes"
    )
    todo = _WHAT_TO_DO.get(key_source, _WHAT_TO_DO["passphrase"])
    return (
        f"vault {hint.vault_id} was re-keyed on another device and retired{successor}: this "
        f"device no longer pushes to it; {kept}{erase}. To continue: {todo}"
    )


def retired_error(hint: RetiredHint, *, pending: int, key_source: str) -> VaultRetiredError:
    """The error a sync of a retired vault ends with (after its pull, with nothing lost)."""
    message = retired_message(hint, pending=pending, key_source=key_source)
    return VaultRetiredError(message, successor=hint.successor)
