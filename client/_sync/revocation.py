"""This device revoked, as the relay says it (PROTOCOL §8, §10, §15; docs/live-sync.md
"Revoked, as the relay says it").

The relay says a device is revoked in three ways: a push answer listing it in
`revoked_devices` (§8), a 403 `device_revoked` on any route (§10), the live feed's
`event: revoked` (§15). The relay is untrusted, so its word is a state to check again,
never a verdict kept for good (issue 31):

- the device stops pushing and tells the person (§8), and remembers it
  (`SyncState.revoked`), so `status` says it;
- the next sync asks again: it pulls (a device-bound key of a revoked device gets 403
  there, §10), then reads the vault's roster (§5) before it pushes anything. A roster
  that still marks this device revoked keeps it revoked and nothing is pushed; one that
  does not (the relay lied once, or an operator undid it) clears the state and the sync
  goes on, with every edit that waited;
- `engram-sync link` clears it, and gives the device a new device id when the old one is
  revoked (`needs_new_identity`): a revoked id stays revoked on the relay, so linking
  again with a new key under it would only be refused again. The memories, the unpushed
  edits and the clock stay (`Device.renew_identity`).
"""

from __future__ import annotations

from engram_sync.shared_format.wire import DeviceRoster


def revoked_in_roster(roster: DeviceRoster, device_id: str) -> bool:
    """Whether the relay's roster marks `device_id` revoked (absent: not revoked)."""
    return any(entry.device_id == device_id and entry.revoked for entry in roster.devices)


def needs_new_identity(*, remembered: bool, roster_says: bool) -> bool:
    """At `link`: a new device id when the relay said this id is revoked, at a sync
    (`remembered`, e.g. after `engram-sync revoke <own id>`) or in the roster the new key
    reads. Either may be a lie; a new id costs nothing but a roster line."""
    return remembered or roster_says


def revoked_message(device_id: str, vault_id: str | None) -> str:
    """The words for the person: what happened and what to do (PROTOCOL §8)."""
    return (
        f"this device ({device_id}) was revoked for vault {vault_id}: it stops pushing; its "
        "local memories and unpushed edits are kept, and each sync asks the relay again. To "
        "sync again, ask an admin for a new key and run `engram-sync link` with it (this "
        "device then gets a new device id and pushes what is pending)."
    )
