"""Relay routes of the account layer (PROTOCOL §13), pairing codes and the team handoff (§14).

A :class:`RelayClient` subclass: same retries, typed errors and redaction. Its
bearer is a session token (`ses_…`) for the `/account` routes, an API key for
the vault routes (handoff, pairing codes), or nothing for `/auth/*` and
`/pair/redeem`. Every `password` argument is the *login secret*
(shared_format.login), never the account password. Calls that create something
(sign-up, minting a key, issuing or redeeming a pairing code, posting a handoff
request) are `Retry.IDEMPOTENT` (docs/retries.md): sent with an Idempotency-Key and
retried freely when the relay honours one, else retried only while the relay provably
did not act. Claiming a seal, which the relay erases as it hands it over, stays
`Retry.NEVER_AFTER_SEND`: on a lost answer, OutcomeUnknownError says how to check.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import NoReturn

from msgspec import UNSET

from engram_sync.shared_format.login import normalize_email
from engram_sync.shared_format.timestamps import parse_rfc3339
from engram_sync.shared_format.wire import (
    AccountCreated,
    AccountInfo,
    AccountWraps,
    CreatePairingCodeRequest,
    GrantRequest,
    GrantRole,
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
    VaultGrantInfo,
    VaultGrantList,
    VaultGrantRevoked,
    VaultWrap,
    VaultWrapDeleted,
    VaultWrapWrite,
    encode_json,
)

from .._errors import RelayMisbehavedError, one_line
from .relay_client import RelayClient, Retry, path_segment

VAULT_KEY_HEADER = "X-Engram-Vault-Key"
# Bounds on what a grant answer may name (the relay's own ids are `acct_` + 16 hex digits;
# an email is at most 254 characters): anything longer or unprintable is refused, so a
# relay cannot put terminal escapes or a screenful of text on the admin's screen.
MAX_GRANT_ID_CHARS = 128
MAX_GRANT_EMAIL_CHARS = 320


def _vault(vault_id: str) -> str:
    return f"/v1/vaults/{path_segment(vault_id)}"


class AccountClient(RelayClient):
    """The account, pairing and handoff routes; construct it like a RelayClient."""

    def __enter__(self) -> AccountClient:
        return self

    # -- /auth (no bearer) ----------------------------------------------------------------

    def signup(self, email: str, password: str) -> AccountCreated:
        """`POST /auth/signup`: a new account, signed in."""
        body = encode_json(SignupRequest(email=email, password=password))
        return self._call(
            "POST",
            "/auth/signup",
            AccountCreated,
            retry=Retry.IDEMPOTENT,
            lost="the account may have been created; run `engram-sync account signin` "
            "with the same email and password",
            content=body,
        )

    def signin(self, email: str, password: str) -> SessionIssued:
        """`POST /auth/signin`: a new session (401 `invalid_credentials`)."""
        body = encode_json(SigninRequest(email=email, password=password))
        return self._call("POST", "/auth/signin", SessionIssued, retry=Retry.SAFE, content=body)

    def logout(self) -> LoggedOut:
        """`POST /auth/logout`: end this client's session."""
        return self._call("POST", "/auth/logout", LoggedOut, retry=Retry.SAFE, content=b"{}")

    def recover_start(self, email: str) -> RecoveryWrap:
        """`POST /auth/recover/start`: the account's recovery wrap (404 if none)."""
        body = encode_json(RecoverStartRequest(email=email))
        return self._call(
            "POST", "/auth/recover/start", RecoveryWrap, retry=Retry.SAFE, content=body
        )

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
        return self._call("POST", "/auth/recover", SessionIssued, retry=Retry.SAFE, content=body)

    # -- /account (session bearer) ----------------------------------------------------------

    def account(self) -> AccountInfo:
        """`GET /account`: the account, the vaults it owns and its keys."""
        return self._call("GET", "/account", AccountInfo, retry=Retry.SAFE)

    def mint_key(
        self, vault_id: str, *, device_id: str | None, label: str | None, admin: bool | None = None
    ) -> MintedAccountKey:
        """`POST /account/keys`: a key for an owned or granted vault (shown once). `admin`
        None leaves the field out: the relay mints the best key the account may have there
        (admin for the owner and an admin grant, member for a member grant; PROTOCOL §13)."""
        body = encode_json(
            MintAccountKeyRequest(
                vault_id=vault_id,
                device_id=device_id,
                label=label,
                admin=UNSET if admin is None else admin,
            )
        )
        return self._call(
            "POST",
            "/account/keys",
            MintedAccountKey,
            retry=Retry.IDEMPOTENT,
            lost="a key may have been minted whose answer never arrived (it is unused); run "
            "the command again, then see the vault's devices with `engram-sync devices`",
            content=body,
        )

    def wraps(self) -> AccountWraps:
        """`GET /account/wraps`: both wraps of A, null where missing."""
        return self._call("GET", "/account/wraps", AccountWraps, retry=Retry.SAFE)

    def password_wrap(self) -> PasswordWrap:
        """`GET /account/wraps/password` (404 `no_wrap`)."""
        return self._call("GET", "/account/wraps/password", PasswordWrap, retry=Retry.SAFE)

    def put_password_wrap(self, wrapped_a: str, salt_pw: str, password: str) -> PasswordWrap:
        """`PUT /account/wraps/password` (current login secret in `password`)."""
        body = encode_json(
            PasswordWrapWrite(wrapped_a=wrapped_a, salt_pw=salt_pw, password=password)
        )
        return self._call(
            "PUT", "/account/wraps/password", PasswordWrap, retry=Retry.SAFE, content=body
        )

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
        return self._call(
            "PUT", "/account/wraps/recovery", RecoveryWrap, retry=Retry.SAFE, content=body
        )

    def vault_wrap(self, vault_id: str) -> VaultWrap:
        """`GET /account/vaults/{v}/wrap` (404 `no_wrap`)."""
        return self._call(
            "GET", f"/account/vaults/{path_segment(vault_id)}/wrap", VaultWrap, retry=Retry.SAFE
        )

    def put_vault_wrap(
        self, vault_id: str, wrapped_k: str, password: str, *, vault_key: str | None = None
    ) -> VaultWrap:
        """`PUT /account/vaults/{v}/wrap`; `vault_key` (an admin key) adopts an existing vault."""
        body = encode_json(VaultWrapWrite(wrapped_k=wrapped_k, password=password))
        headers = {VAULT_KEY_HEADER: vault_key} if vault_key else None
        path = f"/account/vaults/{path_segment(vault_id)}/wrap"
        return self._call("PUT", path, VaultWrap, retry=Retry.SAFE, content=body, headers=headers)

    def delete_vault_wrap(self, vault_id: str, password: str) -> VaultWrapDeleted:
        """`DELETE /account/vaults/{v}/wrap` (idempotent)."""
        body = encode_json(PasswordConfirmation(password=password))
        path = f"/account/vaults/{path_segment(vault_id)}/wrap"
        return self._call("DELETE", path, VaultWrapDeleted, retry=Retry.SAFE, content=body)

    # -- pairing codes ----------------------------------------------------------------------

    def create_pairing_code(self, vault_id: str, label: str | None = None) -> PairingCodeIssued:
        """`POST /v1/vaults/{v}/pairing-codes` (admin key, or an owning account's session)."""
        body = encode_json(CreatePairingCodeRequest(label=label))
        return self._call(
            "POST",
            f"{_vault(vault_id)}/pairing-codes",
            PairingCodeIssued,
            retry=Retry.IDEMPOTENT,
            lost="a pairing code may have been issued that nobody received (it expires "
            "unused); run `engram-sync team invite` again",
            content=body,
        )

    def redeem_pairing_code(self, code: str, device_id: str, label: str | None) -> PairingRedeemed:
        """`POST /pair/redeem` (no bearer); a retry under the same Idempotency-Key gets the
        key the code was traded for (a code works once)."""
        body = encode_json(RedeemPairingCodeRequest(code=code, device_id=device_id, label=label))
        return self._call(
            "POST",
            "/pair/redeem",
            PairingRedeemed,
            retry=Retry.IDEMPOTENT,
            lost="the pairing code may have been used up by this attempt; ask the admin "
            "for a new code",
            content=body,
        )

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
        return self._call(
            "POST",
            f"{_vault(vault_id)}/handoff",
            HandoffCreated,
            retry=Retry.IDEMPOTENT,
            lost="a key request may have been posted; run `engram-sync team request` again "
            "and have the admin approve only the request with this device's fingerprint",
            content=body,
        )

    def handoff_pending(self, vault_id: str) -> HandoffList:
        """`GET /v1/vaults/{v}/handoff` (admin): pending requests."""
        return self._call("GET", f"{_vault(vault_id)}/handoff", HandoffList, retry=Retry.SAFE)

    def handoff_status(self, vault_id: str, request_id: str) -> HandoffStatus:
        """`GET /v1/vaults/{v}/handoff/{id}`."""
        path = f"{_vault(vault_id)}/handoff/{path_segment(request_id)}"
        return self._call("GET", path, HandoffStatus, retry=Retry.SAFE)

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
        admin's SPAKE2 message and the authenticator, §14 step 4). Retry.SAFE: a repeat
        after a lost answer is refused 409 `already_sealed`, it never seals twice."""
        body = encode_json(
            HandoffSealRequest(
                public_key=public_key,
                sealed=sealed,
                pake=UNSET if pake is None else pake,
                auth=UNSET if auth is None else auth,
            )
        )
        path = f"{_vault(vault_id)}/handoff/{path_segment(request_id)}/seal"
        return self._call("POST", path, HandoffSealed, retry=Retry.SAFE, content=body)

    def handoff_claim(self, vault_id: str, request_id: str) -> HandoffClaimed:
        """`POST /v1/vaults/{v}/handoff/{id}/claim`, never repeated once sent: the relay
        erases the seal."""
        path = f"{_vault(vault_id)}/handoff/{path_segment(request_id)}/claim"
        return self._call(
            "POST",
            path,
            HandoffClaimed,
            retry=Retry.NEVER_AFTER_SEND,
            lost="the sealed key may have been claimed and erased; run `engram-sync team "
            "request` again and ask the admin to approve the new request",
            content=b"{}",
        )

    def handoff_cancel(self, vault_id: str, request_id: str) -> HandoffCancelled:
        """`DELETE /v1/vaults/{v}/handoff/{id}`."""
        path = f"{_vault(vault_id)}/handoff/{path_segment(request_id)}"
        return self._call("DELETE", path, HandoffCancelled, retry=Retry.SAFE)

    # -- vault grants (§13 "Vault ownership", admin API key bearer) -------------------------

    def grant_vault(
        self,
        vault_id: str,
        *,
        email: str | None = None,
        account_id: str | None = None,
        role: GrantRole = "member",
    ) -> VaultGrantInfo:
        """`POST /v1/vaults/{v}/grants` (admin; idempotent): let the account with `email`
        (or `account_id`) mint keys and store its wrap for the vault, with `role` (PROTOCOL
        §13; `admin` is the owner's to give). 404 `no_account` when the relay has no such
        account. The answer must name this vault and that account (RelayMisbehavedError
        otherwise)."""
        if (email is None) == (account_id is None):
            raise ValueError("name the account by exactly one of email or account_id")
        path = f"{_vault(vault_id)}/grants"
        body = encode_json(GrantRequest(email=email, account_id=account_id, role=role))
        info = self._call("POST", path, VaultGrantInfo, retry=Retry.SAFE, content=body)
        self._check_grant(info, vault_id, f"POST {path}")
        if email is not None and normalize_email(info.email) != normalize_email(email):
            self._misbehaved(f"POST {path}", f"a grant for {info.email!r}, not {email!r}")
        if account_id is not None and info.account_id != account_id.strip():
            self._misbehaved(f"POST {path}", f"a grant for {info.account_id!r}, not {account_id!r}")
        if info.role is not UNSET and info.role != role:  # left out: a relay without roles
            self._misbehaved(f"POST {path}", f"a grant of role {info.role!r}, not {role!r}")
        return info

    def vault_grants(self, vault_id: str) -> VaultGrantList:
        """`GET /v1/vaults/{v}/grants` (admin): the accounts granted the vault, oldest first.
        Every entry must name this vault, once per account (RelayMisbehavedError otherwise)."""
        path = f"{_vault(vault_id)}/grants"
        listed = self._call("GET", path, VaultGrantList, retry=Retry.SAFE)
        where = f"GET {path}"
        if listed.vault_id != vault_id:
            self._misbehaved(where, f"the grants of vault {listed.vault_id!r}")
        seen: set[str] = set()
        for grant in listed.grants:
            self._check_grant(grant, vault_id, where)
            if grant.account_id in seen:
                self._misbehaved(where, f"account {grant.account_id!r} twice")
            seen.add(grant.account_id)
        return listed

    def revoke_vault_grant(self, vault_id: str, account_id: str) -> VaultGrantRevoked:
        """`DELETE /v1/vaults/{v}/grants/{account_id}` (admin; idempotent: `revoked` is false
        when there was none, also when a retry follows a lost answer). The answer must name
        this vault and account."""
        path = f"{_vault(vault_id)}/grants/{path_segment(account_id)}"
        revoked = self._call("DELETE", path, VaultGrantRevoked, retry=Retry.SAFE)
        if revoked.vault_id != vault_id or revoked.account_id != account_id:
            self._misbehaved(
                f"DELETE {path}",
                f"the removal of {revoked.account_id!r} from vault {revoked.vault_id!r}",
            )
        return revoked

    def _check_grant(self, grant: VaultGrantInfo, vault_id: str, where: str) -> None:
        """A grant of an answer: of this vault, with a printable, bounded id, email and time."""
        if grant.vault_id != vault_id:
            self._misbehaved(where, f"a grant of vault {grant.vault_id!r}")
        if not _shown_safely(grant.account_id, MAX_GRANT_ID_CHARS) or " " in grant.account_id:
            self._misbehaved(where, "a grant with a malformed account id")
        if not _shown_safely(grant.email, MAX_GRANT_EMAIL_CHARS) or "@" not in grant.email:
            self._misbehaved(where, "a grant with a malformed email")
        try:
            parse_rfc3339(grant.granted_at)
        except ValueError:
            self._misbehaved(where, "a grant with a malformed granted_at")

    def _misbehaved(self, where: str, what: str) -> NoReturn:
        raise RelayMisbehavedError(
            one_line(
                f"the relay at {self.base_url} answered {where} with {what}: refused "
                "(no honest relay answers so; check the relay URL)"
            )
        )


def _shown_safely(text: str, max_chars: int) -> bool:
    """Non-empty, at most `max_chars`, and nothing a terminal would interpret."""
    return 0 < len(text) <= max_chars and text.isprintable()
