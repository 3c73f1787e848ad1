"""The account on the device side (PROTOCOL §13): sign-up, sign-in, recovery, and vault keys
kept in the account, so a new device syncs a vault without its sync passphrase.

Zero knowledge: the relay gets the login secret (shared_format.login) wherever
it asks for a `password`; the account password itself only wraps and unwraps
the account key A on the device. The session lives in the vault directory's
`config.json` under `account` ({server_url, email, account_id, session_token,
expires_at}, file mode 0600). No function here prints or logs a password, A,
K, a token or a phrase; errors say what to do in one line.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, Final

from engram_sync.shared_format.b64 import Base64Error, b64decode_std, b64encode_std
from engram_sync.shared_format.errors import KeyUnwrapError, RecoveryPhraseError
from engram_sync.shared_format.login import login_secret, normalize_email
from engram_sync.shared_format.recovery import generate_recovery_phrase, validate_recovery_phrase
from engram_sync.shared_format.recovery_proof import open_recovery_wrap, wrap_for_recovery
from engram_sync.shared_format.wire import AccountCreated, SessionIssued
from engram_sync.shared_format.wraps import (
    new_account_key,
    unwrap_vault_key,
    unwrap_with_secret,
    wrap_vault_key,
    wrap_with_secret,
)

from .._atomic import write_json_atomic
from .._errors import AuthError, ForbiddenError, RelayError, SyncError
from .._http.account_client import AccountClient
from .._http.relay_client import RelayClient
from .._session import VaultSession
from .._sync.config import CONFIG_FILE, load_config_file, load_sync_config
from .._vault.vault_key_store import (
    pack_keys,
    store_vault_key,
    verify_keys_on_relay,
)
from .pairing import require_passphrase_vault, save_link

ACCOUNT_BLOCK: Final = "account"
MIN_PASSWORD_CHARS: Final = 10
WRONG_PASSWORD: Final = "wrong account password"  # noqa: S105 (a message)
NO_WRAP: Final = (
    "this account has no key wrap yet: run `engram-sync account signin` once to finish "
    "setting it up"
)
RECOVERY_REFUSED: Final = (
    "the relay refused the recovery: this phrase matches the recovery wrap but not the "
    "relay's record of it; set up a new phrase from a signed-in device, or ask the operator"
)
SESSION_ENDED: Final = "the account session expired or was ended: run `engram-sync account signin`"


class AccountError(SyncError):
    """An account step failed; the message says what to do."""


@dataclass
class AccountConfig:
    """The `account` block of config.json: who is signed in where. `repr` hides the token."""

    server_url: str
    email: str
    account_id: str
    session_token: str
    expires_at: str

    def __repr__(self) -> str:
        return (
            f"AccountConfig(server_url={self.server_url!r}, email={self.email!r}, "
            f"account_id={self.account_id!r}, session_token='…', expires_at={self.expires_at!r})"
        )


# --- the account block of config.json ---------------------------------------------------------


def load_account(vault_dir: Path) -> AccountConfig | None:
    """The signed-in account of this vault directory, or None."""
    block = load_config_file(vault_dir).get(ACCOUNT_BLOCK)
    if not block:
        return None
    try:
        return AccountConfig(**{k: str(block[k]) for k in AccountConfig.__dataclass_fields__})
    except (KeyError, TypeError):
        raise ValueError(
            f"{vault_dir / CONFIG_FILE}: the `account` block is incomplete; run "
            "`engram-sync account signin` again"
        ) from None


def save_account(vault_dir: Path, account: AccountConfig) -> None:
    """Replace the `account` block (0600, atomic), keeping every other key."""
    data = load_config_file(vault_dir)
    data[ACCOUNT_BLOCK] = asdict(account)
    write_json_atomic(vault_dir / CONFIG_FILE, data)


def clear_account(vault_dir: Path) -> bool:
    """Drop the `account` block; True if there was one."""
    data = load_config_file(vault_dir)
    if data.pop(ACCOUNT_BLOCK, None) is None:
        return False
    write_json_atomic(vault_dir / CONFIG_FILE, data)
    return True


def require_account(vault_dir: Path) -> AccountConfig:
    """The signed-in account, or an error saying how to sign in."""
    account = load_account(vault_dir)
    if account is None:
        raise AccountError(
            "not signed in to an account: run `engram-sync account signin --relay URL` "
            "(or `account signup`)"
        )
    return account


# --- helpers ----------------------------------------------------------------------------------


def password_problem(password: str) -> str | None:
    """Why a new account password is refused (checked here: the relay sees only a hash of it)."""
    if len(password) < MIN_PASSWORD_CHARS:
        return f"the account password must be at least {MIN_PASSWORD_CHARS} characters"
    return None


@contextmanager
def relay_errors(**messages: str) -> Iterator[None]:
    """Turn relay errors whose code is a keyword here into AccountError(message)."""
    try:
        yield
    except RelayError as exc:
        message = messages.get(exc.code)
        if message is None:
            raise
        raise AccountError(message) from None


def _b64(text: str, what: str) -> bytes:
    try:
        return b64decode_std(text)
    except Base64Error:
        raise AccountError(f"the relay sent a malformed {what}; check the relay URL") from None


def _norm_url(url: str) -> str:
    return url.strip().rstrip("/")


def _keep_session(
    vault_dir: Path, server_url: str, email: str, issued: AccountCreated | SessionIssued
) -> AccountConfig:
    account = AccountConfig(
        server_url=_norm_url(server_url),
        email=normalize_email(email),
        account_id=issued.account_id,
        session_token=issued.session_token,
        expires_at=issued.expires_at,
    )
    save_account(vault_dir, account)
    return account


def _signin_session(vault_dir: Path, server_url: str, email: str, secret: str) -> AccountConfig:
    with (
        AccountClient(server_url, None) as relay,
        relay_errors(invalid_credentials="wrong email or account password"),
    ):
        issued = relay.signin(normalize_email(email), secret)
    return _keep_session(vault_dir, server_url, email, issued)


def _put_new_password_wrap(relay: AccountClient, password: str, secret: str) -> None:
    wrapped_a, salt_pw = wrap_with_secret(new_account_key(), password)
    with relay_errors(wrong_password=WRONG_PASSWORD, unauthorized=SESSION_ENDED):
        relay.put_password_wrap(b64encode_std(wrapped_a), b64encode_std(salt_pw), secret)


@dataclass
class Unlocked:
    """A signed-in account with its account key A opened (A stays in memory only)."""

    account: AccountConfig
    secret: str  # the login secret, for wrap writes
    account_key: bytes

    def __repr__(self) -> str:
        return f"Unlocked(account={self.account!r})"

    def client(self, **kwargs: Any) -> AccountClient:
        """A client authenticated by the session."""
        return AccountClient(self.account.server_url, self.account.session_token, **kwargs)


def unlock(vault_dir: Path, password: str) -> Unlocked:
    """Open A with the account password; signs in again if the session ended.

    AccountError "wrong account password" when the password does not open the
    password wrap (checked on the device, before anything is written anywhere).
    """
    account = require_account(vault_dir)
    secret = login_secret(password, account.email)
    for attempt in range(2):
        with AccountClient(account.server_url, account.session_token) as relay:
            try:
                with relay_errors(no_wrap=NO_WRAP):
                    wrap = relay.password_wrap()
            except AuthError:
                if attempt:
                    raise AccountError(SESSION_ENDED) from None
                try:
                    account = _signin_session(vault_dir, account.server_url, account.email, secret)
                except AccountError:
                    raise AccountError(WRONG_PASSWORD) from None
                continue
        try:
            a = unwrap_with_secret(
                _b64(wrap.wrapped_a, "wrap"), _b64(wrap.salt_pw, "salt"), password
            )
        except KeyUnwrapError:
            raise AccountError(WRONG_PASSWORD) from None
        return Unlocked(account, secret, a)
    raise AssertionError("unreachable")  # pragma: no cover


# --- sign-up, sign-in, sign-out ---------------------------------------------------------------


def signup(vault_dir: Path, server_url: str, email: str, password: str) -> AccountConfig:
    """Create the account, sign in, and store A wrapped under the password."""
    problem = password_problem(password)
    if problem:
        raise AccountError(problem)
    secret = login_secret(password, email)
    server_url = _norm_url(server_url)
    with (
        AccountClient(server_url, None) as relay,
        relay_errors(
            email_taken="an account with this email exists: run `engram-sync account signin`",
            invalid_request="the relay refused this email address: check it",
        ),
    ):
        created = relay.signup(normalize_email(email), secret)
    account = _keep_session(vault_dir, server_url, email, created)
    with AccountClient(server_url, account.session_token) as relay:
        _put_new_password_wrap(relay, password, secret)
    return account


def signin(vault_dir: Path, server_url: str, email: str, password: str) -> AccountConfig:
    """Sign in and keep the session; finishes a sign-up that stopped before its key wrap."""
    secret = login_secret(password, email)
    account = _signin_session(vault_dir, server_url, email, secret)
    with AccountClient(account.server_url, account.session_token) as relay:
        wraps = relay.wraps()
        if wraps.wrapped_a is None and not relay.account().vaults:
            _put_new_password_wrap(relay, password, secret)
    return account


def signout(vault_dir: Path) -> bool:
    """End the session on the relay (best effort) and forget it here; False if none."""
    account = load_account(vault_dir)
    if account is None:
        return False
    try:
        with AccountClient(account.server_url, account.session_token, max_retries=1) as relay:
            relay.logout()
    except SyncError:
        pass  # already ended, or the relay is unreachable: forgetting it here is what counts
    return clear_account(vault_dir)


def status(vault_dir: Path) -> dict[str, Any]:
    """What `account status` shows (never the token)."""
    account = load_account(vault_dir)
    info: dict[str, Any] = {
        "signed_in": account is not None,
        "server_url": account.server_url if account else None,
        "email": account.email if account else None,
        "account_id": account.account_id if account else None,
        "expires_at": account.expires_at if account else None,
        "session_valid": None,
        "vaults": None,
    }
    if account is None:
        return info
    try:
        with AccountClient(account.server_url, account.session_token, max_retries=0) as relay:
            details = relay.account()
        info["session_valid"] = True
        info["vaults"] = details.vaults
    except AuthError:
        info["session_valid"] = False
    except SyncError:
        pass  # unreachable: unknown
    return info


# --- recovery ---------------------------------------------------------------------------------


def set_recovery_phrase(vault_dir: Path, password: str) -> str:
    """Make a new recovery phrase and store A wrapped under it; returns the phrase (show once).

    A phrase set earlier stops working.
    """
    unlocked = unlock(vault_dir, password)
    phrase = generate_recovery_phrase()
    wrap = wrap_for_recovery(unlocked.account_key, phrase)
    with (
        unlocked.client() as relay,
        relay_errors(wrong_password=WRONG_PASSWORD, unauthorized=SESSION_ENDED),
    ):
        relay.put_recovery_wrap(wrap.wire(), unlocked.secret)
    return phrase


def recover(
    vault_dir: Path, server_url: str, email: str, phrase: str, new_password: str
) -> AccountConfig:
    """Set a new account password with the recovery phrase; keeps the new session."""
    problem = password_problem(new_password)
    if problem:
        raise AccountError(problem)
    try:
        phrase = validate_recovery_phrase(phrase)
    except RecoveryPhraseError as exc:
        raise AccountError(f"{exc}; check the 12 words") from None
    email = normalize_email(email)
    server_url = _norm_url(server_url)
    with AccountClient(server_url, None) as relay:
        with relay_errors(
            recovery_unavailable="no recovery phrase is set up for this email on this relay "
            "(or there is no such account): check the email and the relay URL"
        ):
            start = relay.recover_start(email)
        try:
            a, proof = open_recovery_wrap(
                _b64(start.wrapped_a_rec, "wrap"), _b64(start.salt_rec, "salt"), phrase
            )
        except KeyUnwrapError:
            raise AccountError(
                "this recovery phrase does not open the account: check the 12 words "
                "(a newer phrase replaces older ones)"
            ) from None
        wrapped_a, salt_pw = wrap_with_secret(a, new_password)
        with relay_errors(recovery_failed=RECOVERY_REFUSED):
            issued = relay.recover(
                email,
                b64encode_std(proof),
                login_secret(new_password, email),
                b64encode_std(wrapped_a),
                b64encode_std(salt_pw),
            )
    return _keep_session(vault_dir, server_url, email, issued)


# --- vault keys in the account ----------------------------------------------------------------


def _linked(session: VaultSession) -> tuple[str, str]:
    vault_id, server_url = session.config.vault_id, session.config.server_url
    if not vault_id or not server_url:
        raise AccountError("this vault is not linked to a relay: run `engram-sync link` first")
    return vault_id, server_url


def _same_relay(account: AccountConfig, server_url: str) -> None:
    if _norm_url(account.server_url) != _norm_url(server_url):
        raise AccountError(
            f"the account is signed in at {account.server_url}, not at {server_url}: run "
            f"`engram-sync account signin --relay {server_url}`"
        )


def open_vault(session: VaultSession, password: str) -> str:
    """Store the linked vault's K in the account, wrapped under A (`vault open`).

    The keys are checked against a blob of the vault first when it has any. When
    the vault already exists on the relay, this device's API key (an admin key
    for the vault) proves the right to adopt it (`X-Engram-Vault-Key`), which the relay
    records as a grant (PROTOCOL §13).
    """
    vault_id, server_url = _linked(session)
    _same_relay(require_account(session.path), server_url)
    keys = session.keys
    with RelayClient(server_url, session.config.api_key, device_id=session.device.device_id) as r:
        verify_keys_on_relay(r, vault_id, keys)
    unlocked = unlock(session.path, password)
    wrapped_k = b64encode_std(wrap_vault_key(pack_keys(keys, vault_id), unlocked.account_key))
    messages = {"wrong_password": WRONG_PASSWORD, "unauthorized": SESSION_ENDED}
    with unlocked.client() as relay:
        try:
            with relay_errors(**messages):
                relay.put_vault_wrap(vault_id, wrapped_k, unlocked.secret)
        except RelayError as exc:
            if exc.code not in ("vault_owned", "vault_claimed"):  # §13; older relays: 409
                raise
            with relay_errors(
                forbidden=f"vault {vault_id} already exists on the relay and this device's API "
                "key is not an admin key for it: link with an admin key, or ask its admin",
                vault_claimed=f"vault {vault_id} is held by another account",
                vault_owned=f"vault {vault_id} is owned by the operator or another account: "
                "ask an admin of it for a grant (`engram-sync team grant EMAIL`)",
                **messages,
            ):
                relay.put_vault_wrap(
                    vault_id, wrapped_k, unlocked.secret, vault_key=session.config.api_key
                )
    return vault_id


def close_vault(vault_dir: Path, password: str) -> bool:
    """Delete the linked vault's K from the account (`vault close`); False if none was there.

    Keys minted from the account stay valid; revoke devices to lock them out.
    """
    config = load_sync_config(vault_dir)
    vault_id, server_url = config.vault_id, config.server_url
    if not vault_id or not server_url:
        raise AccountError("this vault is not linked to a relay: run `engram-sync link` first")
    account = require_account(vault_dir)
    _same_relay(account, server_url)
    secret = login_secret(password, account.email)
    with (
        AccountClient(account.server_url, account.session_token) as relay,
        relay_errors(wrong_password=WRONG_PASSWORD, unauthorized=SESSION_ENDED),
    ):
        return relay.delete_vault_wrap(vault_id, secret).deleted


# long: PROTOCOL §13's sign-in, unwrap and link steps in their order
def link_with_account(
    session: VaultSession,
    server_url: str,
    password: str,
    vault_id: str | None = None,
    label: str | None = None,
) -> str:
    """Link this device to a vault the account holds K for: no sync passphrase needed.

    Opens A with the password, then K of the vault (its vault_id checked), mints a
    key bound to this device, keeps K in the local vault and writes the sync config.
    """
    require_passphrase_vault(session)
    _same_relay(require_account(session.path), server_url)
    unlocked = unlock(session.path, password)
    device = session.device
    with unlocked.client() as relay, relay_errors(unauthorized=SESSION_ENDED):
        owned = relay.account().vaults
        if vault_id is None:
            if not owned:
                raise AccountError(
                    "this account holds no vault keys yet: run `engram-sync vault open` on a "
                    "device that has the vault"
                )
            if len(owned) > 1:
                raise AccountError(
                    f"this account holds several vaults ({', '.join(owned)}): pass --vault-id"
                )
            vault_id = owned[0]
        elif vault_id not in owned:
            raise AccountError(
                f"this account holds no key for vault {vault_id}"
                + (f" (it holds: {', '.join(owned)})" if owned else "")
            )
        wrap = relay.vault_wrap(vault_id)
        try:
            k = unwrap_vault_key(_b64(wrap.wrapped_k, "vault wrap"), unlocked.account_key, vault_id)
        except KeyUnwrapError:
            raise AccountError(
                f"the key of vault {vault_id} stored in the account does not open with the "
                "account key: store it again with `engram-sync vault open`"
            ) from None
        if label:
            device.label = label
            device.save()
        if session.state.revoked:  # issue 31: the relay revoked this id; link under a new one
            session.renew_device_id()
        try:
            minted = relay.mint_key(vault_id, device_id=device.device_id, label=device.label)
        except ForbiddenError as exc:
            if exc.code != "device_revoked":
                raise
            # issue 31 (client._sync.revocation): the relay keeps this id revoked; a new id
            # is minted for, once (a second refusal is not about this device's id)
            session.renew_device_id()
            minted = relay.mint_key(vault_id, device_id=device.device_id, label=device.label)
    with RelayClient(server_url, minted.key, device_id=device.device_id) as vault_relay:
        vault_relay.register_device(vault_id, device.device_id, device.label)
    with session.vault.transaction() as conn:
        store_vault_key(conn, k, "account")
    save_link(session, server_url, minted.key, vault_id)
    return vault_id
