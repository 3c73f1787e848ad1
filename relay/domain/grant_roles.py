"""What an owner, an admin grant and a member grant may do with a vault (PROTOCOL §13
"Grants carry a role"; docs/vault-ownership.md "Roles"), as pure decisions.

A caller's *standing* in a vault is one of:

- `owner`: the operator (a key with no account: static keys, `engram-relay keys create`)
  holding an admin key for the vault, or the account that owns the vault through an
  admin key it minted (or its session, where a route takes one);
- `admin`: an account granted the vault with role `admin`, through an admin key;
- `member`: an account granted the vault with role `member` (the default), or any
  non-admin key;
- `none`: an account with neither ownership nor a grant (its grant was removed).

Rules: a member may mint member keys and store its wrap; an admin may also mint admin
keys, grant `member`, remove member grants and revoke devices; only the owner may retire
a vault (or undo it), grant `admin`, take `admin` back or remove an admin's grant. A
granted account can never take the vault away from its owner (nothing here moves
ownership). The routes read the standing (relay.store.owners) and ask these functions;
`RoleRefusedError` is answered 403 with its code by relay.http.errors.
"""

from __future__ import annotations

from typing import Final, Literal, TypeAlias

from engram_sync.relay.domain.api_keys import Principal
from engram_sync.relay.domain.domain_errors import DomainError

Role: TypeAlias = Literal["member", "admin"]
Standing: TypeAlias = Literal["owner", "admin", "member", "none"]

MEMBER: Final = "member"
ADMIN: Final = "admin"
OWNER: Final = "owner"
NONE: Final = "none"
ROLES: Final = (MEMBER, ADMIN)
_RANK: Final = {NONE: 0, MEMBER: 1, ADMIN: 2, OWNER: 3}


class RoleRefusedError(DomainError):
    """The caller's standing in the vault does not allow this (403 with `code`)."""

    def __init__(self, code: str, message: str) -> None:
        super().__init__(message)
        self.code = code  # `admin_not_granted` or `owner_only`
        self.message = message


def account_standing(owner_account: str | None, account_id: str, role: str | None) -> Standing:
    """The standing of an account: `owner` when it owns the vault, else its grant's role."""
    if owner_account is not None and owner_account == account_id:
        return OWNER
    if role == ADMIN:
        return ADMIN
    return MEMBER if role == MEMBER else NONE


def key_standing(principal: Principal, vault_id: str, account: Standing | None) -> Standing:
    """The standing a key gives in the vault: an operator key's is `owner` when it is an
    admin key there; an account's key gives at most its account's standing (`account`),
    and `member` at most when it is not an admin key."""
    admin_key = principal.is_admin_for(vault_id)
    if principal.account_id is None:
        return OWNER if admin_key else MEMBER
    assert account is not None  # an account key's account standing is always read
    if admin_key or account == NONE:
        return account
    return MEMBER


def at_least(standing: Standing, wanted: Standing) -> bool:
    """True when `standing` is `wanted` or more."""
    return _RANK[standing] >= _RANK[wanted]


def require_admin(standing: Standing, vault_id: str) -> None:
    """An admin route (grants, device revocation, handoff approval, pairing by key):
    the owner or an admin grant, through an admin key."""
    if not at_least(standing, ADMIN):
        raise RoleRefusedError(
            "admin_not_granted",
            f"this key's account has no admin grant of vault {vault_id} (a member grant, or "
            "none any more), so it cannot do this: ask the vault's owner for an admin grant",
        )


def require_owner(standing: Standing, vault_id: str, what: str) -> None:
    """A route only the owner may use (`what` says what, e.g. "retire it")."""
    if standing != OWNER:
        raise RoleRefusedError(
            "owner_only",
            f"only the owner of vault {vault_id} (the operator or the account that owns it) "
            f"may {what}; an admin grant may not",
        )


def minted_key_is_admin(asked: bool | None, standing: Standing, vault_id: str) -> bool:
    """Whether a key an account mints is an admin key (`POST /account/keys`).

    `asked` None (the field left out): an admin key for the owner and an admin grant, a
    member key for a member grant. Asked for an admin key with a member grant: refused."""
    if asked is None:
        return at_least(standing, ADMIN)
    if asked and not at_least(standing, ADMIN):
        raise RoleRefusedError(
            "admin_not_granted",
            f"this account has a member grant of vault {vault_id}: it may mint member keys "
            "only (`admin: false`); the vault's owner can make the grant an admin grant",
        )
    return asked


def check_grant_change(standing: Standing, vault_id: str, asked: Role, current: str | None) -> None:
    """May a caller of `standing` (owner or admin) give an account the role `asked`, when
    its grant has the role `current` (None: no grant yet)? Granting `admin`, and turning an
    admin grant back into a member grant, are the owner's."""
    if asked == ADMIN:
        require_owner(standing, vault_id, "grant admin")
    elif current == ADMIN:
        require_owner(standing, vault_id, "take admin back from an admin grant")


def check_grant_removal(standing: Standing, vault_id: str, current: str | None) -> None:
    """May a caller of `standing` (owner or admin) remove a grant of role `current`?"""
    if current == ADMIN:
        require_owner(standing, vault_id, "remove an admin grant")
