"""Wire types of the sync protocol as msgspec Structs (PROTOCOL §3, §5, §9, §11, §17).

Field names and defaults are those of the compatible core. Decoding ignores
unknown fields (the format evolves additively); additive fields of ours
(`cursor`, `generation`, `head`, a pulled blob's `seq`) are `UNSET` by default and
then not emitted at all, so a writer never sends a core field with a different type.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Final, Literal, TypeVar

import msgspec
from msgspec import UNSET, Meta, Struct, UnsetType

from .errors import WireDecodeError

MAX_BLOBS_PER_PUSH: Final = 1000  # PROTOCOL §5
MAX_PULL_LIMIT: Final = 1000  # PROTOCOL §5
DEFAULT_PULL_LIMIT: Final = 1000  # PROTOCOL §5
# A Lamport counter: u64 on the wire, but it must fit a signed 64-bit integer on
# the relay (PROTOCOL §1, §6 step 1), so decoding refuses anything >= 2^63.
MAX_VECTOR_CLOCK: Final = 2**63 - 1

VectorClock = Annotated[int, Meta(ge=0, le=MAX_VECTOR_CLOCK)]
Cursor = Annotated[int, Meta(ge=0)]


class SyncBlob(Struct, frozen=True):
    """One encrypted version of one memory, or a tombstone (PROTOCOL §3)."""

    vault_id: str
    memory_id: str
    device_id: str
    vector_clock: VectorClock
    ciphertext: str
    hmac: str
    created_at: str
    deleted: bool  # required, no default (PROTOCOL §3)
    # Additive (PROTOCOL §5, §9): the relay's sequence number of this blob, sent on
    # cursor-mode pulls only. Not covered by the HMAC of §3; the relay ignores it in a
    # push body.
    seq: Cursor | UnsetType = UNSET


class PushRequest(Struct, frozen=True):
    """Body of `POST /v1/vaults/{vault_id}/push` (PROTOCOL §5)."""

    blobs: list[SyncBlob]


class VaultDigest(Struct, frozen=True):
    """Ours (docs/digest.md "Carried in push and pull answers"): the vault's §18 digest and
    count at the sequence `cursor`, as `GET /digest` would answer them there. A hint the
    device checks like that answer, never trusted more (client._sync.anti_entropy)."""

    cursor: Cursor
    count: Annotated[int, Meta(ge=0)]
    digest: str


class PushResponse(Struct, frozen=True):
    """Answer to a push (PROTOCOL §5); `cursor` (§9) and `generation` (§17) are ours, and
    so is `vault_digest` (§18 after the commit, additive: docs/digest.md)."""

    accepted: int
    rejected: list[str] = msgspec.field(default_factory=list)
    revoked_devices: list[str] = msgspec.field(default_factory=list)
    cursor: Cursor | UnsetType = UNSET
    generation: str | UnsetType = UNSET
    vault_digest: VaultDigest | UnsetType = UNSET


class PullRequest(Struct, frozen=True):
    """Query of `GET /v1/vaults/{vault_id}/pull` (PROTOCOL §5, §7, §9).

    `since` empty means none; `cursor` selects the commit-ordered mode of §9. The relay reads
    `limit=0` as the default and caps the page at MAX_PULL_LIMIT (relay/http/routes/sync.py).
    """

    since: str | None = None
    limit: Annotated[int, Meta(ge=0)] = DEFAULT_PULL_LIMIT
    cursor: Cursor | None = None


class VaultRetirement(Struct, frozen=True):
    """`retired` of a pull of a retired vault (PROTOCOL §19): a hint, never trusted.

    `statement` and `stated_at` (additive, sent only when the retire stored them): the
    successor statement of §19's last bullet, which the follower checks under the old
    vault's hmac key (shared_format.successor_statement) before it follows."""

    successor: str | None
    erase_after: str  # RFC 3339 UTC: after it the vault's blobs are erased
    statement: str | UnsetType = UNSET
    stated_at: str | UnsetType = UNSET


class PullResponse(Struct, frozen=True):
    """Answer to a pull (PROTOCOL §5); `cursor` (§9) and `generation` (§17) are ours.

    `head` (cursor mode only) is the vault's sequence when the page was read (0 for a
    vault nobody pushed to); a head below the device's cursor means a restored relay.
    `retired` (§19) is sent only for a retired vault, absent on a live one.
    `vault_digest` (ours, additive: docs/digest.md) only on a cursor page with `has_more`
    false whose last blob is the vault's head: §18 at `head`, read with the page.
    """

    blobs: list[SyncBlob]
    has_more: bool
    cursor: Cursor | UnsetType = UNSET
    generation: str | UnsetType = UNSET
    head: Cursor | UnsetType = UNSET
    retired: VaultRetirement | UnsetType = UNSET
    vault_digest: VaultDigest | UnsetType = UNSET


class ChangeEvent(Struct, frozen=True):
    """`data` of the event stream's `event: change` (PROTOCOL §15).

    `cursor` is the vault's sequence, the hint of §15. The rest is ours (docs/live-feed.md
    "Blobs in the event"), sent only on a stream asked with `blobs=1` (feature
    `events-blobs`) and only for small commits: `blobs` are every blob committed in
    (`after`, `cursor`], as a cursor pull from `after` would give them (with `seq`), and
    `generation` the relay's (§17). A device whose cursor is exactly `after` may apply
    them as that pull's page, checked like one; any other device pulls as for a hint.
    """

    cursor: Cursor
    after: Cursor | UnsetType = UNSET
    generation: str | UnsetType = UNSET
    blobs: list[SyncBlob] | UnsetType = UNSET


class RetireRequest(Struct, frozen=True):
    """Body of `POST /v1/vaults/{vault_id}/retire` (PROTOCOL §19).

    `statement` (base64 of the 32-byte MAC) and `stated_at` (the `retired_at` text it
    covers) are additive: the successor statement (shared_format.successor_statement)."""

    successor: str | None
    statement: str | UnsetType | None = UNSET
    stated_at: str | UnsetType | None = UNSET


class RetireResponse(Struct, frozen=True):
    """Answer to a retire (PROTOCOL §19), the same for a repeated identical call;
    `statement`/`stated_at` the stored successor statement, when there is one."""

    vault_id: str
    successor: str | None
    retired_at: str  # RFC 3339 UTC
    erase_after: str
    statement: str | UnsetType = UNSET
    stated_at: str | UnsetType = UNSET


class RetireUndone(Struct, frozen=True):
    """Answer to `DELETE /v1/vaults/{vault_id}/retire` (the owner, within the grace period;
    docs/rekey.md): `undone` is false when the vault was not retired (idempotent)."""

    vault_id: str
    undone: bool


class SyncHealth(Struct, frozen=True):
    """`GET /health` (PROTOCOL §5); `total_blobs` counts live blobs."""

    status: str
    version: str
    uptime_secs: int
    vaults: int
    total_blobs: int
    db_size_bytes: int


class VaultStats(Struct, frozen=True):
    """`GET /v1/vaults/{vault_id}/stats` and its `/sync/{vault_id}/stats` alias (PROTOCOL §5)."""

    vault_id: str
    total_blobs: int
    latest_sync: str | None


class DeviceEntry(Struct, frozen=True):
    """One row of the device roster (PROTOCOL §5)."""

    device_id: str
    last_seen: str | None
    blob_count: int
    revoked: bool
    label: str | None


class DeviceRoster(Struct, frozen=True):
    """`GET /v1/vaults/{vault_id}/devices` (PROTOCOL §5), newest first."""

    vault_id: str
    devices: list[DeviceEntry]


class RegisterDeviceRequest(Struct, frozen=True):
    """Body of `POST /v1/vaults/{vault_id}/devices/register` (PROTOCOL §5)."""

    device_id: str
    label: str


class DeviceRegistered(Struct, frozen=True):
    """Answer to a device registration (PROTOCOL §5)."""

    vault_id: str
    device_id: str
    label: str
    registered: bool = True


class DeviceRevoked(Struct, frozen=True):
    """Answer to `DELETE /v1/vaults/{vault_id}/devices/{device_id}` (PROTOCOL §5)."""

    vault_id: str
    device_id: str
    revoked: bool = True


class RelayInfo(Struct, frozen=True):
    """`GET /v1/info`, the limits advertisement (PROTOCOL §11)."""

    protocol: str
    max_blobs_per_push: int
    max_blob_bytes: int
    max_pull_limit: int
    max_body_bytes: int
    features: list[str] = msgspec.field(default_factory=list)
    generation: str | UnsetType = UNSET  # PROTOCOL §17
    # Additive (PROTOCOL §11, issue 14): a pull page stops adding blobs once its ciphertext
    # passes this many base64 characters (always at least one blob, then `has_more`).
    max_page_bytes: int | UnsetType = UNSET


class ErrorBody(Struct, frozen=True):
    """The relay's JSON error body (PROTOCOL §5); extra detail is additive."""

    error: str
    code: str


class QuotaErrorDetail(Struct, frozen=True):
    """Inner object of the 402 quota body (PROTOCOL §5)."""

    code: str
    detail: str
    limit: int
    used: int


class QuotaErrorBody(Struct, frozen=True):
    """The exact 402 body: `{"error":{"code":"quota_exceeded","detail",...}}` (PROTOCOL §5)."""

    error: QuotaErrorDetail


T = TypeVar("T")

_PATH_RE = re.compile(r" - at `(?P<path>\$[^`]*)`$")
_MISSING_RE = re.compile(r"^Object missing required field `(?P<name>[^`]*)`")


def _field_of(message: str) -> str | None:
    """The JSON path msgspec names, extended with the missing field's name if any."""
    path_match = _PATH_RE.search(message)
    path = path_match.group("path") if path_match else "$"
    missing = _MISSING_RE.match(message)
    if missing:
        return f"{path}.{missing.group('name')}"
    return path if path_match else None


def decode_json(data: bytes | str, type_: type[T]) -> T:
    """Decode JSON into a wire type; any failure is a WireDecodeError naming the field.

    The field is a JSON path such as `$.blobs[3].vector_clock` (None when the
    document itself is not JSON).
    """
    try:
        return msgspec.json.decode(data, type=type_)
    except msgspec.ValidationError as exc:
        message = str(exc)
        field = _field_of(message)
        raise WireDecodeError(f"invalid {type_.__name__}: {message}", field) from None
    except msgspec.DecodeError as exc:
        raise WireDecodeError(f"malformed JSON: {exc}", None) from None
    except UnicodeDecodeError:
        raise WireDecodeError("malformed JSON: not UTF-8 text", None) from None
    except RecursionError:
        raise WireDecodeError("malformed JSON: nested too deeply", None) from None


def convert(obj: Any, type_: type[T]) -> T:
    """Convert already-parsed builtins (e.g. query parameters) into a wire type."""
    try:
        return msgspec.convert(obj, type=type_, strict=False)
    except msgspec.ValidationError as exc:
        message = str(exc)
        raise WireDecodeError(f"invalid {type_.__name__}: {message}", _field_of(message)) from None


def encode_json(obj: Any) -> bytes:
    """Encode a wire type (or builtins) as compact JSON."""
    return msgspec.json.encode(obj)


# --- PROTOCOL §13: accounts and key wraps --------------------------------------------------
# Wraps, salts, the recovery verifier and proof are standard base64 with padding;
# timestamps are RFC 3339. Optional request fields may be left out.


class SignupRequest(Struct, frozen=True):
    """Body of `POST /auth/signup` (password: at least 10 characters)."""

    email: str
    password: str


class SigninRequest(Struct, frozen=True):
    """Body of `POST /auth/signin`."""

    email: str
    password: str


class AccountCreated(Struct, frozen=True):
    """Answer to a sign-up: the account, already signed in (the token is shown once)."""

    account_id: str
    email: str
    created_at: str
    session_token: str
    expires_at: str


class SessionIssued(Struct, frozen=True):
    """Answer to `POST /auth/signin` and `POST /auth/recover` (the token is shown once)."""

    account_id: str
    session_token: str
    expires_at: str


class LoggedOut(Struct, frozen=True):
    """Answer to `POST /auth/logout`."""

    logged_out: bool = True


class AccountKeyInfo(Struct, frozen=True):
    """One key of the account in `GET /account` (never the key itself)."""

    id: str
    prefix: str
    vault_id: str | None
    device_id: str | None
    is_admin: bool
    label: str | None
    created_at: str
    revoked: bool


class AccountInfo(Struct, frozen=True):
    """`GET /account`: `vaults` are the vault ids the account holds a wrap for (owns)."""

    account_id: str
    email: str
    created_at: str
    vaults: list[str]
    keys: list[AccountKeyInfo]


class MintAccountKeyRequest(Struct, frozen=True):
    """Body of `POST /account/keys`. `admin` left out: an admin key for the vault's owner
    and an admin grant, a member key for a member grant (PROTOCOL §13 "Grants carry a
    role"); `admin: true` with a member grant is 403 `admin_not_granted`."""

    vault_id: str
    device_id: str | None = None
    label: str | None = None
    admin: bool | UnsetType = UNSET


class MintedAccountKey(Struct, frozen=True):
    """A key minted from a session (the key text is shown once)."""

    id: str
    key: str
    prefix: str
    vault_id: str
    device_id: str | None
    is_admin: bool
    label: str | None


class AccountKeyRevoked(Struct, frozen=True):
    """Answer to `DELETE /account/keys/{id}` (idempotent)."""

    id: str
    revoked: bool = True


class PasswordWrapWrite(Struct, frozen=True):
    """`PUT /account/wraps/password`: `password` is the current one; a `new_password`
    replaces the login password in the same transaction (ending the other sessions)."""

    wrapped_a: str
    salt_pw: str
    password: str
    new_password: str | None = None


class PasswordWrap(Struct, frozen=True):
    """The password wrap of A as stored."""

    wrapped_a: str
    salt_pw: str
    updated_at: str
    password_changed: bool = False


class RecoveryWrapWrite(Struct, frozen=True):
    """`PUT /account/wraps/recovery`: `recovery_verifier` = SHA-256(recovery proof), see
    shared_format.recovery_proof; `password` is the current login password."""

    wrapped_a_rec: str
    salt_rec: str
    recovery_verifier: str
    password: str


class RecoveryWrap(Struct, frozen=True):
    """The recovery wrap of A as stored (and as `POST /auth/recover/start` hands it out)."""

    wrapped_a_rec: str
    salt_rec: str
    updated_at: str


class AccountWraps(Struct, frozen=True):
    """`GET /account/wraps`: both wraps of A, null where not stored."""

    wrapped_a: str | None
    salt_pw: str | None
    wrapped_a_rec: str | None
    salt_rec: str | None
    updated_at: str | None


class VaultWrapWrite(Struct, frozen=True):
    """`PUT /account/vaults/{vault_id}/wrap` (`password` is the current login password)."""

    wrapped_k: str
    password: str


class VaultWrap(Struct, frozen=True):
    """One vault key wrap as stored."""

    vault_id: str
    wrapped_k: str
    updated_at: str


class PasswordConfirmation(Struct, frozen=True):
    """Body of `DELETE /account/vaults/{vault_id}/wrap`."""

    password: str


class VaultWrapDeleted(Struct, frozen=True):
    """Answer to deleting a vault wrap (idempotent; `deleted` false if there was none)."""

    vault_id: str
    deleted: bool


class PasskeyWrapWrite(Struct, frozen=True):
    """`PUT /account/vaults/{vault_id}/passkeys/{credential_id}` (docs/web-vault.md "Passkey
    unlock", our addition to §13): K wrapped under a passkey's PRF-derived key, the PRF salt
    (public), and the current login `password`."""

    wrapped_k: str
    prf_salt: str
    password: str


class VaultPasskeyWrapWrite(Struct, frozen=True):
    """`PUT /v1/vaults/{vault_id}/passkeys/{credential_id}` (docs/web-vault.md "Passkey
    unlock", passphrase vaults; our addition to §13): K wrapped under a passkey's PRF-derived
    key and the PRF salt (public), under a vault key's auth (no password: no account)."""

    wrapped_k: str
    prf_salt: str


class PasskeyWrap(Struct, frozen=True):
    """One passkey wrap of a vault key as stored."""

    vault_id: str
    credential_id: str
    wrapped_k: str
    prf_salt: str
    updated_at: str


class PasskeyInfo(Struct, frozen=True):
    """A passkey of a vault in a listing (never its wrap)."""

    credential_id: str
    prf_salt: str
    updated_at: str


class PasskeyList(Struct, frozen=True):
    """`GET /account/vaults/{vault_id}/passkeys`: the account's passkeys for the vault."""

    vault_id: str
    passkeys: list[PasskeyInfo]


class PasskeyWrapDeleted(Struct, frozen=True):
    """Answer to deleting a passkey wrap (idempotent; `deleted` false if there was none)."""

    vault_id: str
    credential_id: str
    deleted: bool


class RecoverStartRequest(Struct, frozen=True):
    """Body of `POST /auth/recover/start`."""

    email: str


class RecoverRequest(Struct, frozen=True):
    """Body of `POST /auth/recover`: the proof opens nothing; the new wrap is of the same A."""

    email: str
    proof: str
    new_password: str
    wrapped_a: str
    salt_pw: str


# --- Pairing codes (our addition) ---------------------------------------------------------


class CreatePairingCodeRequest(Struct, frozen=True):
    """Body of `POST /v1/vaults/{vault_id}/pairing-codes` (may be empty)."""

    label: str | None = None
    device_bound: bool = True


class PairingCodeIssued(Struct, frozen=True):
    """A new pairing code `ENG-XXXX-XXXX-XXXX` (shown once)."""

    code: str
    vault_id: str
    expires_at: str
    label: str | None
    device_bound: bool


class RedeemPairingCodeRequest(Struct, frozen=True):
    """Body of `POST /pair/redeem`; `label` defaults to the code's label."""

    code: str
    device_id: str
    label: str | None = None


class PairingRedeemed(Struct, frozen=True):
    """The key a redeemed code produced (shown once): non-admin, device-bound if the code was."""

    vault_id: str
    api_key: str
    key_id: str
    device_id: str
    label: str
    device_bound: bool


# --- PROTOCOL §14: team key handoff -------------------------------------------------------
# Public keys and seals are base64url without padding. `pake`, `pairing_id` and `auth`
# (§14 step 4, pairing-code path; docs/handoff.md) are additive: UNSET, and then not
# emitted, on the member-request path.


class HandoffCreateRequest(Struct, frozen=True):
    """Body of `POST /v1/vaults/{vault_id}/handoff`: a 65-byte SEC1 P-256 public key;
    with a pairing code also the requester's SPAKE2 message (33 bytes, side B) and the
    code's public id (64 hex), both or neither."""

    public_key: str
    label: str = ""
    pake: str | UnsetType = UNSET
    pairing_id: str | UnsetType = UNSET


class HandoffCreated(Struct, frozen=True):
    """Answer to a handoff request: show `fingerprint` on the requester's screen."""

    request_id: str
    vault_id: str
    expires_at: str
    fingerprint: str
    status: str = "pending"


class HandoffPending(Struct, frozen=True):
    """One pending request as an admin lists it; `fingerprint` is computed from `public_key`."""

    request_id: str
    public_key: str
    label: str
    fingerprint: str
    created_at: str
    expires_at: str
    pake: str | UnsetType = UNSET
    pairing_id: str | UnsetType = UNSET


class HandoffList(Struct, frozen=True):
    """`GET /v1/vaults/{vault_id}/handoff`: pending requests, oldest first."""

    vault_id: str
    requests: list[HandoffPending]


class HandoffStatus(Struct, frozen=True):
    """`GET /v1/vaults/{vault_id}/handoff/{request_id}`: pending, sealed, claimed or expired."""

    request_id: str
    vault_id: str
    status: str
    fingerprint: str
    label: str
    created_at: str
    expires_at: str
    sealed_at: str | None
    claimed_at: str | None


class HandoffSealRequest(Struct, frozen=True):
    """Body of the seal route: the admin's ephemeral public key and the seal of K; for a
    request made with a pairing code (and only then) also the admin's SPAKE2 message
    (33 bytes, side A) and `auth`, the 32-byte HMAC of §14 step 4."""

    public_key: str
    sealed: str
    pake: str | UnsetType = UNSET
    auth: str | UnsetType = UNSET


class HandoffSealed(Struct, frozen=True):
    """Answer to the seal route."""

    request_id: str
    vault_id: str
    sealed_at: str
    status: str = "sealed"


class HandoffClaimed(Struct, frozen=True):
    """Answer to the claim route, given exactly once: open it with the requester's key."""

    request_id: str
    vault_id: str
    public_key: str
    sealed: str
    pake: str | UnsetType = UNSET
    auth: str | UnsetType = UNSET


class HandoffCancelled(Struct, frozen=True):
    """Answer to `DELETE /v1/vaults/{vault_id}/handoff/{request_id}`."""

    request_id: str
    vault_id: str
    deleted: bool = True


# --- Vault grants (our addition to PROTOCOL §13 "Vault ownership"; docs/vault-ownership.md) ---


GrantRole = Literal["member", "admin"]


class GrantRequest(Struct, frozen=True):
    """Body of `POST /v1/vaults/{vault_id}/grants`: the account, by email or by id, and
    the grant's role (additive, PROTOCOL §13: `member` by default; `admin` is the owner's
    to give)."""

    email: str | None = None
    account_id: str | None = None
    role: GrantRole = "member"


class VaultGrantInfo(Struct, frozen=True):
    """An account an admin of the vault let in (it may mint keys and store a wrap there)."""

    vault_id: str
    account_id: str
    email: str
    granted_at: str
    # additive (PROTOCOL §13): left out by relays without `grant-roles`, where every grant
    # could do what an admin grant does
    role: GrantRole | UnsetType = UNSET


class VaultGrantList(Struct, frozen=True):
    """Answer to `GET /v1/vaults/{vault_id}/grants`, oldest first."""

    vault_id: str
    grants: list[VaultGrantInfo]


class VaultGrantRevoked(Struct, frozen=True):
    """Answer to `DELETE /v1/vaults/{vault_id}/grants/{account_id}` (idempotent)."""

    vault_id: str
    account_id: str
    revoked: bool
