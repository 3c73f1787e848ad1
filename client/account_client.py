"""Relay routes of the account layer (PROTOCOL §13), pairing codes and the team handoff (§14).

A :class:`RelayClient` subclass: same retries, typed errors and redaction. Its
bearer is a session token (`ses_…`) for the `/account` routes, an API key for
the vault routes (handoff, pairing codes), or nothing for `/auth/*` and
`/pair/redeem`. Every `password` argument is the *login secret*
(shared_format.login), never the account password. Calls whose first attempt
may consume something that cannot be asked for twice (redeeming a code,
claiming a seal) are sent once, without retries.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import TypeVar

from msgspec import UNSET

from client.relay_client import RelayClient, path_segment
from shared_format.wire import (
    AccountCreated,
    AccountInfo,
    AccountWraps,
    CreatePairingCodeRequest,
    HandoffCancelled,
    HandoffClaimed,
    HandoffCreated,
    HandoffCreateRequest,
    HandoffList,
    HandoffSealed,
    HandoffSealRequest,
    HandoffStatus,
    LoggedOut,
    MintAccountKeyRequest,
    MintedAccountKey,
    PairingCodeIssued,
    PairingRedeemed,
    PasswordConfirmation,
    PasswordWrap,
    PasswordWrapWrite,
    RecoverRequest,
    RecoverStartRequest,
    RecoveryWrap,
    RecoveryWrapWrite,
    RedeemPairingCodeRequest,
    SessionIssued,
    SigninRequest,
    SignupRequest,
    VaultWrap,
    VaultWrapDeleted,
    VaultWrapWrite,
    encode_json,
)

T = TypeVar("T")
VAULT_KEY_HEADER = "X-Engram-Vault-Key"


def _vault(vault_id: str) -> str:
    return f"/v1/vaults/{path_segment(vault_id)}"


class AccountClient(RelayClient):
    """The account, pairing and handoff routes; construct it like a RelayClient."""

    def __enter__(self) -> AccountClient:
        return self

    def _once(
        self,
        method: str,
        path: str,
        type_: type[T],
        *,
        content: bytes | None = None,
    ) -> T:
        """One attempt, no retry: for calls that consume what they answer."""
        saved, self.max_retries = self.max_retries, 0
        try:
            return self._call(method, path, type_, content=content)
        finally:
            self.max_retries = saved

    # -- /auth (no bearer) ----------------------------------------------------------------

    def signup(self, email: str, password: str) -> AccountCreated:
        """`POST /auth/signup`: a new account, signed in."""
        body = encode_json(SignupRequest(email=email, password=password))
        return self._call("POST", "/auth/signup", AccountCreated, content=body)

    def signin(self, email: str, password: str) -> SessionIssued:
        """`POST /auth/signin`: a new session (401 `invalid_credentials`)."""
        body = encode_json(SigninRequest(email=email, password=password))
        return self._call("POST", "/auth/signin", SessionIssued, content=body)

    def logout(self) -> LoggedOut:
        """`POST /auth/logout`: end this client's session."""
        return self._call("POST", "/auth/logout", LoggedOut, content=b"{}")

    def recover_start(self, email: str) -> RecoveryWrap:
        """`POST /auth/recover/start`: the account's recovery wrap (404 if none)."""
        body = encode_json(RecoverStartRequest(email=email))
        return self._call("POST", "/auth/recover/start", RecoveryWrap, content=body)

    def recover(
        self, email: str, proof: str, new_password: str, wrapped_a: str, salt_pw: str
    ) -> SessionIssued:
        """`POST /auth/recover`: new password and password wrap, proven by the phrase."""
        body = encode_json(
            RecoverRequest(
                email=email,
                proof=proof,
                new_password=new_password,
                wrapped_a=wrapped_a,
                salt_pw=salt_pw,
            )
        )
        return self._call("POST", "/auth/recover", SessionIssued, content=body)

    # -- /account (session bearer) ----------------------------------------------------------

    def account(self) -> AccountInfo:
        """`GET /account`: the account, the vaults it owns and its keys."""
        return self._call("GET", "/account", AccountInfo)

    def mint_key(
        self, vault_id: str, *, device_id: str | None, label: str | None, admin: bool = True
    ) -> MintedAccountKey:
        """`POST /account/keys`: a key for an owned vault (shown once)."""
        body = encode_json(
            MintAccountKeyRequest(vault_id=vault_id, device_id=device_id, label=label, admin=admin)
        )
        return self._call("POST", "/account/keys", MintedAccountKey, content=body)

    def wraps(self) -> AccountWraps:
        """`GET /account/wraps`: both wraps of A, null where missing."""
        return self._call("GET", "/account/wraps", AccountWraps)

    def password_wrap(self) -> PasswordWrap:
        """`GET /account/wraps/password` (404 `no_wrap`)."""
        return self._call("GET", "/account/wraps/password", PasswordWrap)

    def put_password_wrap(self, wrapped_a: str, salt_pw: str, password: str) -> PasswordWrap:
        """`PUT /account/wraps/password` (current login secret in `password`)."""
        body = encode_json(
            PasswordWrapWrite(wrapped_a=wrapped_a, salt_pw=salt_pw, password=password)
        )
        return self._call("PUT", "/account/wraps/password", PasswordWrap, content=body)

    def put_recovery_wrap(self, wire: Mapping[str, str], password: str) -> RecoveryWrap:
        """`PUT /account/wraps/recovery` with a RecoveryWrap's `wire()` fields."""
        body = encode_json(
            RecoveryWrapWrite(
                wrapped_a_rec=wire["wrapped_a_rec"],
                salt_rec=wire["salt_rec"],
                recovery_verifier=wire["recovery_verifier"],
                password=password,
            )
        )
        return self._call("PUT", "/account/wraps/recovery", RecoveryWrap, content=body)

    def vault_wrap(self, vault_id: str) -> VaultWrap:
        """`GET /account/vaults/{v}/wrap` (404 `no_wrap`)."""
        return self._call("GET", f"/account/vaults/{path_segment(vault_id)}/wrap", VaultWrap)

    def put_vault_wrap(
        self, vault_id: str, wrapped_k: str, password: str, *, vault_key: str | None = None
    ) -> VaultWrap:
        """`PUT /account/vaults/{v}/wrap`; `vault_key` (an admin key) adopts an existing vault."""
        body = encode_json(VaultWrapWrite(wrapped_k=wrapped_k, password=password))
        headers = {VAULT_KEY_HEADER: vault_key} if vault_key else None
        path = f"/account/vaults/{path_segment(vault_id)}/wrap"
        return self._call("PUT", path, VaultWrap, content=body, headers=headers)

    def delete_vault_wrap(self, vault_id: str, password: str) -> VaultWrapDeleted:
        """`DELETE /account/vaults/{v}/wrap` (idempotent)."""
        body = encode_json(PasswordConfirmation(password=password))
        path = f"/account/vaults/{path_segment(vault_id)}/wrap"
        return self._call("DELETE", path, VaultWrapDeleted, content=body)

    # -- pairing codes ----------------------------------------------------------------------

    def create_pairing_code(self, vault_id: str, label: str | None = None) -> PairingCodeIssued:
        """`POST /v1/vaults/{v}/pairing-codes` (admin key, or an owning account's session)."""
        body = encode_json(CreatePairingCodeRequest(label=label))
        return self._call(
            "POST", f"{_vault(vault_id)}/pairing-codes", PairingCodeIssued, content=body
        )

    def redeem_pairing_code(self, code: str, device_id: str, label: str | None) -> PairingRedeemed:
        """`POST /pair/redeem` (no bearer), sent once: a code works a single time."""
        body = encode_json(RedeemPairingCodeRequest(code=code, device_id=device_id, label=label))
        return self._once("POST", "/pair/redeem", PairingRedeemed, content=body)

    # -- team key handoff (§14, API key bearer) ---------------------------------------------

    def handoff_request(
        self,
        vault_id: str,
        public_key: str,
        label: str,
        *,
        pake: str | None = None,
        pairing_id: str | None = None,
    ) -> HandoffCreated:
        """`POST /v1/vaults/{v}/handoff`: post an ephemeral public key (with a pairing code,
        also the requester's SPAKE2 message and the code's public id, §14 step 4)."""
        body = encode_json(
            HandoffCreateRequest(
                public_key=public_key,
                label=label,
                pake=UNSET if pake is None else pake,
                pairing_id=UNSET if pairing_id is None else pairing_id,
            )
        )
        return self._call("POST", f"{_vault(vault_id)}/handoff", HandoffCreated, content=body)

    def handoff_pending(self, vault_id: str) -> HandoffList:
        """`GET /v1/vaults/{v}/handoff` (admin): pending requests."""
        return self._call("GET", f"{_vault(vault_id)}/handoff", HandoffList)

    def handoff_status(self, vault_id: str, request_id: str) -> HandoffStatus:
        """`GET /v1/vaults/{v}/handoff/{id}`."""
        path = f"{_vault(vault_id)}/handoff/{path_segment(request_id)}"
        return self._call("GET", path, HandoffStatus)

    def handoff_seal(
        self,
        vault_id: str,
        request_id: str,
        public_key: str,
        sealed: str,
        *,
        pake: str | None = None,
        auth: str | None = None,
    ) -> HandoffSealed:
        """`POST /v1/vaults/{v}/handoff/{id}/seal` (admin; with a pairing code, also the
        admin's SPAKE2 message and the authenticator, §14 step 4)."""
        body = encode_json(
            HandoffSealRequest(
                public_key=public_key,
                sealed=sealed,
                pake=UNSET if pake is None else pake,
                auth=UNSET if auth is None else auth,
            )
        )
        path = f"{_vault(vault_id)}/handoff/{path_segment(request_id)}/seal"
        return self._call("POST", path, HandoffSealed, content=body)

    def handoff_claim(self, vault_id: str, request_id: str) -> HandoffClaimed:
        """`POST /v1/vaults/{v}/handoff/{id}/claim`, sent once: the relay erases the seal."""
        path = f"{_vault(vault_id)}/handoff/{path_segment(request_id)}/claim"
        return self._once("POST", path, HandoffClaimed, content=b"{}")

    def handoff_cancel(self, vault_id: str, request_id: str) -> HandoffCancelled:
        """`DELETE /v1/vaults/{v}/handoff/{id}`."""
        path = f"{_vault(vault_id)}/handoff/{path_segment(request_id)}"
        return self._call("DELETE", path, HandoffCancelled)
