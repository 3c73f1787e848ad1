"""Everything one command needs about a vault directory: the open vault, the device,
the sync config and state, the sync keys and the relay (each made when first needed)."""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from engram_sync.shared_format.sync_keys import SyncKeys, vault_id_v1, vault_id_v2
from engram_sync.shared_format.vault import Vault, VaultKeyKind, open_vault, open_vault_with_key

from ._errors import AuthError, SyncError
from ._file_modes import tighten_modes
from ._sync.config import SyncConfig, load_sync_config, save_sync_config
from ._sync.device import Device
from ._sync.state import SyncState
from ._vault.history import Writer, local_writer
from ._vault.schema import migrate

if TYPE_CHECKING:  # imported where used: a command that never syncs does not load httpx
    from ._http.relay_client import RelayClient
    from ._sync.engine import Syncer
    from ._sync.reports import ProgressCallback


class NotLinkedError(SyncError):
    """The vault has no relay configured yet."""


def choose_vault_id(passphrase: str, relay: RelayClient | None) -> str:
    """PROTOCOL §2: v2 without an API key; else probe v2 then v1, the first with blobs wins."""
    v2 = vault_id_v2(passphrase)
    if relay is None:
        return v2
    for candidate in (v2, vault_id_v1(passphrase)):
        try:
            if relay.stats(candidate).total_blobs > 0:
                return candidate
        except AuthError as exc:
            raise AuthError(
                exc.status,
                exc.code,
                "the relay refused the API key while probing the vault id: check --api-key",
            ) from None
    return v2


@dataclass
class VaultSession:
    """One vault directory opened with its passphrase, or with the keys derived from it that
    the key agent holds (passphrase None; client._agent, docs/agent.md)."""

    path: Path
    passphrase: str | None
    vault: Vault
    device: Device
    config: SyncConfig
    state: SyncState
    _keys: SyncKeys | None = field(default=None, repr=False)
    _passphrase_keys: SyncKeys | None = field(default=None, repr=False)
    _shared_relay: RelayClient | None = field(default=None, repr=False)
    _shared_for: tuple[str | None, str | None, str] | None = field(default=None, repr=False)

    @classmethod
    def open(cls, path: Path, passphrase: str, *, create: bool = False) -> VaultSession:
        """Open (or create) the vault; the passphrase must open it (nothing is written else)."""
        return cls._prepare(path, open_vault(path, passphrase, create=create), passphrase, None)

    @classmethod
    def open_with_keys(
        cls, path: Path, db_key: str, passphrase_keys: SyncKeys | None
    ) -> VaultSession | None:
        """Open the vault with keys already derived from its passphrase (the agent's): the
        database key (VAULT §2) and the passphrase's sync keys (PROTOCOL §2; None for a
        machine-key vault). None when the database key does not open it."""
        kind = VaultKeyKind.MACHINE if passphrase_keys is None else VaultKeyKind.PASSPHRASE
        vault = open_vault_with_key(path, db_key, kind)
        if vault is None:
            return None
        return cls._prepare(path, vault, None, passphrase_keys)

    @classmethod
    def _prepare(
        cls, path: Path, vault: Vault, passphrase: str | None, passphrase_keys: SyncKeys | None
    ) -> VaultSession:
        try:
            tighten_modes(vault.path)
            migrate(vault.conn)  # the client's own tables (client._vault.schema)
            device = Device.load_or_create(path)
            return cls(
                path=path,
                passphrase=passphrase,
                vault=vault,
                device=device,
                config=load_sync_config(path),
                state=SyncState.load(path),
                _passphrase_keys=passphrase_keys,
            )
        except BaseException:
            vault.close()
            raise

    def close(self) -> None:
        """Close the shared relay client and the database."""
        self._drop_shared_relay()
        self.vault.close()

    def __enter__(self) -> VaultSession:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def keys(self) -> SyncKeys:
        """The sync keys, once: a vault key K stored for the linked vault
        (client._vault.vault_key_store), else derived from the passphrase (PROTOCOL §2)."""
        if self._keys is None:
            from ._vault.vault_key_store import session_sync_keys

            secret = self._passphrase_keys or self.passphrase
            if secret is None:
                raise SyncError("a machine-key vault cannot sync: sync keys come from a passphrase")
            self._keys = session_sync_keys(self.vault.conn, self.config.vault_id, secret)
        return self._keys

    def set_keys(self, keys: SyncKeys) -> None:
        """Sync with these keys from now on: a re-key or a switch to a successor vault
        changed the linked vault and already holds its keys."""
        self._keys = keys

    def forget_keys(self) -> None:
        """Pick the sync keys again when next needed: the linked vault changed."""
        self._keys = None

    def writer(self, *, source: str = "user", tool: str | None = None) -> Writer:
        """This device writing now (the local history's record of who wrote a version)."""
        return local_writer(self.device.device_id, self.device.label, source=source, tool=tool)

    def relay(self, **kwargs: object) -> RelayClient:
        """A relay client for the linked relay."""
        if not self.config.server_url:
            raise NotLinkedError(
                "this vault is not linked to a relay: run `engram-sync link --relay URL "
                "--api-key KEY` first"
            )
        from ._http.relay_client import RelayClient

        return RelayClient(
            self.config.server_url,
            self.config.api_key,
            device_id=self.device.device_id,
            **kwargs,  # type: ignore[arg-type]
        )

    def shared_relay(self) -> RelayClient:
        """The session's relay client (issue 36): one connection pool and one /v1/info
        answer for every sync of the session and its live loop (`with_retries` for another
        retry budget on the same pool). Closed by `close`, and replaced when the relay,
        its key or the device id changes."""
        made_for = (self.config.server_url, self.config.api_key, self.device.device_id)
        if self._shared_relay is None or self._shared_for != made_for:
            self._drop_shared_relay()
            self._shared_relay, self._shared_for = self.relay(), made_for
        return self._shared_relay

    def _drop_shared_relay(self) -> None:
        if self._shared_relay is not None:
            self._shared_relay.close()
            self._shared_relay = self._shared_for = None

    def link(self, server_url: str, api_key: str, vault_id: str | None, label: str | None) -> str:
        """Point the vault at a relay, pin the vault id, register this device's label."""
        if self.vault.key_kind is not VaultKeyKind.PASSPHRASE:
            raise SyncError("a machine-key vault cannot sync: sync keys come from a passphrase")
        from ._http.relay_client import RelayClient
        from ._sync.revocation import needs_new_identity, revoked_in_roster

        with RelayClient(server_url, api_key, device_id=self.device.device_id) as relay:
            chosen = (
                vault_id or self.config.vault_id or choose_vault_id(self._vault_id_secret(), relay)
            )
            # issue 31: a device id the relay revoked stays revoked; link under a new one
            renew = needs_new_identity(
                remembered=self.state.revoked,
                roster_says=revoked_in_roster(relay.devices(chosen), self.device.device_id),
            )
        if renew:
            self.renew_device_id()
        with RelayClient(server_url, api_key, device_id=self.device.device_id) as relay:
            relay.register_device(chosen, self.device.device_id, label or self.device.label)
            if label and label != self.device.label:  # kept only once the relay took it
                self.device.label = label
                self.device.save()
        self.config = SyncConfig(
            enabled=True,
            server_url=server_url.rstrip("/"),
            api_key=api_key,
            vault_id=chosen,
            interval_secs=self.config.interval_secs,
        )
        save_sync_config(self.path, self.config)
        self.state.bind(self.config.server_url or "", chosen)
        self.state.relinked()
        return chosen

    def renew_device_id(self) -> None:
        """Link under a new device id: the relay revoked this one (issue 31,
        client._sync.revocation); memories, unpushed edits and the clock stay."""
        self.device.renew_identity()
        self.state.new_device_id()

    def _vault_id_secret(self) -> str:
        """The passphrase a derived vault id needs (PROTOCOL §2); the agent holds no such id."""
        if self.passphrase is None:
            raise SyncError(
                "deriving the vault id needs the passphrase, which the key agent does not hold: "
                "pass --vault-id ID, or run `engram-sync lock` and link again"
            )
        return self.passphrase

    def syncer(
        self, relay: RelayClient, progress: ProgressCallback | None = None, **options: Any
    ) -> Syncer:
        """A syncer for the linked vault."""
        if not self.config.vault_id or not self.config.server_url:
            raise NotLinkedError("this vault is not linked to a relay: run `engram-sync link`")
        self.state.bind(self.config.server_url, self.config.vault_id)
        from ._sync.engine import Syncer

        return Syncer(
            self.vault,
            self.keys,
            self.device,
            self.state,
            relay,
            self.config.vault_id,
            progress=progress,
            **options,
        )
