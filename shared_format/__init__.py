"""The Engram sync format shared by the relay and the client.

Pure and synchronous; no I/O beyond the local vault file. See PROTOCOL.md and
VAULT.md for the contract every name here implements.

The names are loaded when first used (PEP 562): importing one module of the format (the
vault, the timestamps) does not load the others and their dependencies (issue 17).
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any, Final

if TYPE_CHECKING:
    from .b64 import (
        Base64Error,
        b64decode_std,
        b64encode_std,
        b64url_decode,
        b64url_encode,
    )
    from .blob import BlobCipher, blob_hmac
    from .errors import (
        BlobDecryptError,
        BlobMalformedError,
        BlobTamperedError,
        FormatError,
        HandoffError,
        KeyUnwrapError,
        PlaintextError,
        RecoveryPhraseError,
        VaultError,
        WireDecodeError,
        WrongPassphraseError,
    )
    from .handoff import (
        HandoffKeyPair,
        SealedHandoff,
        new_handoff_keypair,
        open_handoff_wire,
        open_sealed_vault_key,
        public_key_fingerprint,
        seal_vault_key,
    )
    from .plaintext import (
        Link,
        MemoryPlaintext,
        Tombstone,
        decode_plaintext,
        encode_memory,
        tombstone_plaintext,
    )
    from .recovery import (
        generate_recovery_phrase,
        normalize_recovery_phrase,
        validate_recovery_phrase,
    )
    from .sync_keys import (
        SyncKeys,
        derive_sync_keys,
        vault_id_v1,
        vault_id_v2,
    )
    from .timestamps import format_rfc3339, parse_rfc3339, utc_now_rfc3339
    from .wire import (
        DeviceEntry,
        DeviceRegistered,
        DeviceRevoked,
        DeviceRoster,
        ErrorBody,
        PullRequest,
        PullResponse,
        PushRequest,
        PushResponse,
        QuotaErrorBody,
        QuotaErrorDetail,
        RegisterDeviceRequest,
        RelayInfo,
        SyncBlob,
        SyncHealth,
        VaultStats,
        convert,
        decode_json,
        encode_json,
    )
    from .wraps import (
        VaultKey,
        derive_wrap_key,
        new_account_key,
        pack_vault_key,
        unpack_vault_key,
        unwrap_secret,
        unwrap_vault_key,
        unwrap_with_secret,
        wrap_secret,
        wrap_vault_key,
        wrap_with_secret,
    )

#: The module each public name lives in.
_WHERE: Final[dict[str, str]] = {
    "Base64Error": "engram_sync.shared_format.b64",
    "BlobCipher": "engram_sync.shared_format.blob",
    "BlobDecryptError": "engram_sync.shared_format.errors",
    "BlobMalformedError": "engram_sync.shared_format.errors",
    "BlobTamperedError": "engram_sync.shared_format.errors",
    "DeviceEntry": "engram_sync.shared_format.wire",
    "DeviceRegistered": "engram_sync.shared_format.wire",
    "DeviceRevoked": "engram_sync.shared_format.wire",
    "DeviceRoster": "engram_sync.shared_format.wire",
    "ErrorBody": "engram_sync.shared_format.wire",
    "FormatError": "engram_sync.shared_format.errors",
    "HandoffError": "engram_sync.shared_format.errors",
    "HandoffKeyPair": "engram_sync.shared_format.handoff",
    "KeyUnwrapError": "engram_sync.shared_format.errors",
    "Link": "engram_sync.shared_format.plaintext",
    "MemoryPlaintext": "engram_sync.shared_format.plaintext",
    "PlaintextError": "engram_sync.shared_format.errors",
    "PullRequest": "engram_sync.shared_format.wire",
    "PullResponse": "engram_sync.shared_format.wire",
    "PushRequest": "engram_sync.shared_format.wire",
    "PushResponse": "engram_sync.shared_format.wire",
    "QuotaErrorBody": "engram_sync.shared_format.wire",
    "QuotaErrorDetail": "engram_sync.shared_format.wire",
    "RecoveryPhraseError": "engram_sync.shared_format.errors",
    "RegisterDeviceRequest": "engram_sync.shared_format.wire",
    "RelayInfo": "engram_sync.shared_format.wire",
    "SealedHandoff": "engram_sync.shared_format.handoff",
    "SyncBlob": "engram_sync.shared_format.wire",
    "SyncHealth": "engram_sync.shared_format.wire",
    "SyncKeys": "engram_sync.shared_format.sync_keys",
    "Tombstone": "engram_sync.shared_format.plaintext",
    "VaultError": "engram_sync.shared_format.errors",
    "VaultKey": "engram_sync.shared_format.wraps",
    "VaultStats": "engram_sync.shared_format.wire",
    "WireDecodeError": "engram_sync.shared_format.errors",
    "WrongPassphraseError": "engram_sync.shared_format.errors",
    "b64decode_std": "engram_sync.shared_format.b64",
    "b64encode_std": "engram_sync.shared_format.b64",
    "b64url_decode": "engram_sync.shared_format.b64",
    "b64url_encode": "engram_sync.shared_format.b64",
    "blob_hmac": "engram_sync.shared_format.blob",
    "convert": "engram_sync.shared_format.wire",
    "decode_json": "engram_sync.shared_format.wire",
    "decode_plaintext": "engram_sync.shared_format.plaintext",
    "derive_sync_keys": "engram_sync.shared_format.sync_keys",
    "derive_wrap_key": "engram_sync.shared_format.wraps",
    "encode_json": "engram_sync.shared_format.wire",
    "encode_memory": "engram_sync.shared_format.plaintext",
    "format_rfc3339": "engram_sync.shared_format.timestamps",
    "generate_recovery_phrase": "engram_sync.shared_format.recovery",
    "new_account_key": "engram_sync.shared_format.wraps",
    "new_handoff_keypair": "engram_sync.shared_format.handoff",
    "normalize_recovery_phrase": "engram_sync.shared_format.recovery",
    "open_handoff_wire": "engram_sync.shared_format.handoff",
    "open_sealed_vault_key": "engram_sync.shared_format.handoff",
    "pack_vault_key": "engram_sync.shared_format.wraps",
    "parse_rfc3339": "engram_sync.shared_format.timestamps",
    "public_key_fingerprint": "engram_sync.shared_format.handoff",
    "seal_vault_key": "engram_sync.shared_format.handoff",
    "tombstone_plaintext": "engram_sync.shared_format.plaintext",
    "unpack_vault_key": "engram_sync.shared_format.wraps",
    "unwrap_secret": "engram_sync.shared_format.wraps",
    "unwrap_vault_key": "engram_sync.shared_format.wraps",
    "unwrap_with_secret": "engram_sync.shared_format.wraps",
    "utc_now_rfc3339": "engram_sync.shared_format.timestamps",
    "validate_recovery_phrase": "engram_sync.shared_format.recovery",
    "vault_id_v1": "engram_sync.shared_format.sync_keys",
    "vault_id_v2": "engram_sync.shared_format.sync_keys",
    "wrap_secret": "engram_sync.shared_format.wraps",
    "wrap_vault_key": "engram_sync.shared_format.wraps",
    "wrap_with_secret": "engram_sync.shared_format.wraps",
}


def __getattr__(name: str) -> Any:
    """A public name, imported on first use and then kept in the package (PEP 562)."""
    module = _WHERE.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})


__all__ = [
    "Base64Error",
    "BlobCipher",
    "BlobDecryptError",
    "BlobMalformedError",
    "BlobTamperedError",
    "DeviceEntry",
    "DeviceRegistered",
    "DeviceRevoked",
    "DeviceRoster",
    "ErrorBody",
    "FormatError",
    "HandoffError",
    "HandoffKeyPair",
    "KeyUnwrapError",
    "Link",
    "MemoryPlaintext",
    "PlaintextError",
    "PullRequest",
    "PullResponse",
    "PushRequest",
    "PushResponse",
    "QuotaErrorBody",
    "QuotaErrorDetail",
    "RecoveryPhraseError",
    "RegisterDeviceRequest",
    "RelayInfo",
    "SealedHandoff",
    "SyncBlob",
    "SyncHealth",
    "SyncKeys",
    "Tombstone",
    "VaultError",
    "VaultKey",
    "VaultStats",
    "WireDecodeError",
    "WrongPassphraseError",
    "b64decode_std",
    "b64encode_std",
    "b64url_decode",
    "b64url_encode",
    "blob_hmac",
    "convert",
    "decode_json",
    "decode_plaintext",
    "derive_sync_keys",
    "derive_wrap_key",
    "encode_json",
    "encode_memory",
    "format_rfc3339",
    "generate_recovery_phrase",
    "new_account_key",
    "new_handoff_keypair",
    "normalize_recovery_phrase",
    "open_handoff_wire",
    "open_sealed_vault_key",
    "pack_vault_key",
    "parse_rfc3339",
    "public_key_fingerprint",
    "seal_vault_key",
    "tombstone_plaintext",
    "unpack_vault_key",
    "unwrap_secret",
    "unwrap_vault_key",
    "unwrap_with_secret",
    "utc_now_rfc3339",
    "validate_recovery_phrase",
    "vault_id_v1",
    "vault_id_v2",
    "wrap_secret",
    "wrap_vault_key",
    "wrap_with_secret",
]
