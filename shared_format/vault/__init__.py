"""The local Engram vault format (VAULT.md): keys, SQLCipher open/create, schema v10.

Public API: `open_vault()` returns a `Vault` (a keyed SQLCipher connection at
schema v10); `normalized_hash()` is the §4 content hash; `utc_now_rfc3339()`
is the timestamp form the vault stores. The key derivations are exposed for
tools and tests. Errors: `VaultError`, `WrongPassphraseError` (shared_format.errors)
and, from the connection, the sqlcipher3 exception classes re-exported here.
"""

from __future__ import annotations

from ..plaintext import SOURCES
from ..timestamps import utc_now_rfc3339
from .content_hash import (
    normalize_content,
    normalized_hash,
    strip_prefixes,
)
from .salt import FALLBACK_SALT_TAG, SALT_FILE_NAME, vault_salt16
from .schema import (
    LAYERS,
    LINK_TYPES,
    PRIVACY_LEVELS,
    SCHEMA_VERSION,
    apply_schema,
)
from .sqlcipher import (
    DatabaseError,
    Error,
    IntegrityError,
    OperationalError,
)
from .sqlcipher_key import (
    MachineIdSource,
    is_vault_key,
    legacy_passphrase_vault_key,
    machine_vault_key,
    passphrase_vault_key,
    read_machine_id,
)
from .store import (
    DB_FILE_NAME,
    Vault,
    VaultKeyKind,
    open_vault,
    open_vault_with_key,
)

__all__ = [
    "DB_FILE_NAME",
    "FALLBACK_SALT_TAG",
    "LAYERS",
    "LINK_TYPES",
    "PRIVACY_LEVELS",
    "SALT_FILE_NAME",
    "SCHEMA_VERSION",
    "SOURCES",
    "DatabaseError",
    "Error",
    "IntegrityError",
    "MachineIdSource",
    "OperationalError",
    "Vault",
    "VaultKeyKind",
    "apply_schema",
    "is_vault_key",
    "legacy_passphrase_vault_key",
    "machine_vault_key",
    "normalize_content",
    "normalized_hash",
    "open_vault",
    "open_vault_with_key",
    "passphrase_vault_key",
    "read_machine_id",
    "strip_prefixes",
    "utc_now_rfc3339",
    "vault_salt16",
]
