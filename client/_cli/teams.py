"""`engram-sync account|vault|team`: the account layer, the vault key in the account,
pairing codes and the team key handoff (PROTOCOL §13, §14)."""

from __future__ import annotations

import os
import sys
from datetime import UTC
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Final

import typer
from rich.markup import escape

from engram_sync.shared_format.timestamps import parse_rfc3339

from .._sync.config import load_sync_config
from .support import (
    OPTIONS,
    CliError,
    err,
    open_session,
    out,
    print_json,
)

if TYPE_CHECKING:
    from .._accounts import team

# The account layer (httpx, spake2, cryptography) is imported in the commands that use it,
# so another command does not load it (issue 17; tests/client/cli/test_cli_imports.py).

#: client._accounts.team.DEFAULT_WAIT_SECS, here for `team request --wait` without importing
#: the handoff at start-up (tests/client/cli/test_cli_imports.py checks they are equal).
DEFAULT_WAIT_SECS: Final = 900.0

account_app = typer.Typer(
    help="Your account on the relay: keeps vault keys wrapped, so new devices need no "
    "sync passphrase.",
    no_args_is_help=True,
)
vault_app = typer.Typer(help="The linked vault's key in your account.", no_args_is_help=True)
team_app = typer.Typer(
    help="Hand the vault key to a new device (pairing codes, key handoff); let other "
    "accounts into the vault (grants).",
    no_args_is_help=True,
)


def _secret_input(env: str, prompt: str, *, confirm: bool = False) -> str:
    value = os.environ.get(env)
    if value:
        return value
    if not sys.stdin.isatty():
        raise CliError(f"no {prompt.lower()}: set {env} or run in a terminal to be asked")
    typed: str = typer.prompt(prompt, hide_input=True, confirmation_prompt=confirm)
    if not typed:
        raise CliError(f"the {prompt.lower()} must not be empty")
    return typed


def account_password(confirm: bool = False) -> str:
    return _secret_input("ENGRAM_ACCOUNT_PASSWORD", "Account password", confirm=confirm)


def _email(given: str | None) -> str:
    if given:
        return given
    if not sys.stdin.isatty():
        raise CliError("no email: pass --email (or ENGRAM_EMAIL) or run in a terminal")
    typed: str = typer.prompt("Email")
    return typed


def _vault_dir() -> Path:
    if not (OPTIONS.vault / "engrams.db").exists():
        raise CliError(f"no vault at {OPTIONS.vault}: run `engram-sync init` (or pass --vault DIR)")
    return OPTIONS.vault


def _relay_url(given: str | None) -> str:
    from .._accounts import account as account_ops

    if given:
        return given
    signed_in = account_ops.load_account(_vault_dir())
    if signed_in is not None:
        return signed_in.server_url
    linked = load_sync_config(_vault_dir()).server_url
    if linked:
        return linked
    raise CliError("pass --relay URL (the relay your account is on)")


RelayOpt = Annotated[
    str | None, typer.Option("--relay", help="Relay URL (default: the account's or linked one).")
]
EmailOpt = Annotated[str | None, typer.Option("--email", envvar="ENGRAM_EMAIL", help="Email.")]


@account_app.command("signup")
def account_signup(relay: RelayOpt = None, email: EmailOpt = None) -> None:
    """Create an account (asks the password twice); signs in on this vault directory."""
    from .._accounts import account as account_ops

    vault_dir, url = _vault_dir(), _relay_url(relay)
    address = _email(email)
    password = account_password(confirm=True)
    signed = account_ops.signup(vault_dir, url, address, password)
    out.print(f"signed up and signed in as {signed.email} on {signed.server_url}")
    err.print(
        "next: `engram-sync vault open` keeps this vault's key in the account; "
        "`engram-sync account recovery-phrase` sets up recovery if you forget the password"
    )


@account_app.command("signin")
def account_signin(relay: RelayOpt = None, email: EmailOpt = None) -> None:
    """Sign in to your account on this vault directory."""
    from .._accounts import account as account_ops

    vault_dir, url = _vault_dir(), _relay_url(relay)
    signed = account_ops.signin(vault_dir, url, _email(email), account_password())
    out.print(f"signed in as {signed.email} on {signed.server_url}")


@account_app.command("signout")
def account_signout() -> None:
    """End the session and forget it on this vault directory."""
    from .._accounts import account as account_ops

    if account_ops.signout(_vault_dir()):
        out.print("signed out")
    else:
        out.print("not signed in")


@account_app.command("recovery-phrase")
def account_recovery_phrase() -> None:
    """Make a recovery phrase (shown once): it resets the password if you forget it."""
    from .._accounts import account as account_ops

    account_ops.require_account(_vault_dir())
    phrase = account_ops.set_recovery_phrase(_vault_dir(), account_password())
    out.print("Your recovery phrase (shown once; any earlier phrase no longer works):")
    out.print()
    out.print(f"    [bold]{escape(phrase)}[/bold]")
    out.print()
    out.print(
        "Write it down and keep it offline. With it, anyone can take over the account; "
        "without it and the password, the account's keys are gone for good."
    )


@account_app.command("recover")
def account_recover(relay: RelayOpt = None, email: EmailOpt = None) -> None:
    """Set a new password with your recovery phrase (the forgotten password is not needed)."""
    from .._accounts import account as account_ops

    vault_dir, url = _vault_dir(), _relay_url(relay)
    address = _email(email)
    phrase = _secret_input("ENGRAM_RECOVERY_PHRASE", "Recovery phrase")
    new_password = _secret_input(
        "ENGRAM_NEW_ACCOUNT_PASSWORD", "New account password", confirm=True
    )
    signed = account_ops.recover(vault_dir, url, address, phrase, new_password)
    out.print(f"new password set; signed in as {signed.email} (every other session was ended)")


@account_app.command("status")
def account_status(
    json_out: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
) -> None:
    """Who is signed in where, and the vaults the account holds keys for."""
    from .._accounts import account as account_ops

    info = account_ops.status(_vault_dir())
    if json_out:
        print_json(info)
        return
    if not info["signed_in"]:
        out.print("not signed in: `engram-sync account signin --relay URL`")
        return
    for key in ("email", "server_url", "account_id", "expires_at", "session_valid"):
        out.print(f"{key}: {escape(str(info[key]))}")
    vaults = info["vaults"]
    shown = "?" if vaults is None else ", ".join(vaults) or "-"
    out.print(f"vaults: {escape(shown)}")


@vault_app.command("open")
def vault_open() -> None:
    """Keep the linked vault's key in your account (wrapped; the relay cannot open it)."""
    from .._accounts import account as account_ops

    account_ops.require_account(_vault_dir())
    with open_session() as session:
        vault_id = account_ops.open_vault(session, account_password())
    out.print(f"the key of vault {vault_id} is now kept in your account")
    err.print(
        "on a new device: `engram-sync account signin`, then "
        "`engram-sync link --relay URL --account`"
    )


@vault_app.command("close")
def vault_close() -> None:
    """Remove the linked vault's key from your account (keys minted from it stay valid)."""
    from .._accounts import account as account_ops

    vault_dir = _vault_dir()
    account_ops.require_account(vault_dir)
    if account_ops.close_vault(vault_dir, account_password()):
        out.print("the vault's key was removed from your account")
    else:
        out.print("your account held no key for this vault")


@team_app.command("invite")
def team_invite(
    label: Annotated[str | None, typer.Option("--label", help="Name of the new device.")] = None,
) -> None:
    """Issue a pairing code for a new device (admin key, or the owning account)."""
    from .._accounts import account as account_ops
    from .._accounts import pairing

    with open_session() as session:
        signed_in = account_ops.load_account(session.path)
        token = None
        if signed_in is not None and signed_in.server_url == session.config.server_url:
            token = signed_in.session_token
        issued = pairing.issue_code(session, label, session_token=token)
    out.print(f"pairing code (shown once, single use, until {issued.expires_at}):")
    out.print(f"    [bold]{escape(issued.code)}[/bold]")
    out.print(
        f"on the new device: `engram-sync link --relay {escape(session.config.server_url or '')} "
        "--code CODE` with the whole code, then `engram-sync team request`; approve it here "
        "with `engram-sync team approve` (the code authenticates it: the relay never sees its "
        "last part)"
    )


@team_app.command("request")
# long: the command's options are its signature (typer)
def team_request(
    label: Annotated[str | None, typer.Option("--label", help="Shown to the admin.")] = None,
    wait: Annotated[
        float, typer.Option("--wait", help="Seconds to wait for an admin.", min=0)
    ] = DEFAULT_WAIT_SECS,
    expect: Annotated[
        str | None,
        typer.Option(
            "--expect",
            help="The admin key's fingerprint `team approve` showed (scripts; else you are asked).",
        ),
    ] = None,
    no_code: Annotated[
        bool,
        typer.Option(
            "--no-code", help="Forget the pairing code; you and the admin compare fingerprints."
        ),
    ] = False,
) -> None:
    """Ask an admin for the vault key (or resume the open request) and keep it on this device."""
    from .._accounts import team

    def show(waiting: team.Waiting) -> None:
        verb = "Resuming request" if waiting.resumed else "Requested the vault key:"
        out.print(f"{verb} {waiting.request_id} (open until {waiting.expires_at})")
        if waiting.by_code:
            out.print(
                "Your pairing code authenticates this request: the admin compares no code. "
                "(If the admin is asked to compare a fingerprint, the relay removed that "
                "authentication: this device would refuse the key anyway.) This device's key:"
            )
        else:
            out.print("Compare this code with the one on the admin's screen:")
        out.print()
        out.print(f"    [bold]{escape(waiting.fingerprint)}[/bold]")
        out.print()
        out.print(
            f"The admin runs `engram-sync team approve {waiting.request_id}`. Waiting "
            f"{wait:g}s (Ctrl-C stops waiting; run this again to resume)."
        )

    def confirm(admin_fingerprint: str) -> bool:
        out.print("The admin's screen shows the fingerprint of its key after approving. This key:")
        out.print()
        out.print(f"    [bold]{escape(admin_fingerprint)}[/bold]")
        out.print()
        answer: bool = typer.confirm(
            "Does it match the admin key fingerprint on the admin's screen?", default=False
        )
        return answer

    interactive = sys.stdin.isatty() and expect is None
    with open_session() as session:
        vault_id = team.request_key(
            session,
            label,
            wait=wait,
            on_waiting=show,
            expect=expect,
            confirm=confirm if interactive else None,
            use_code=not no_code,
        )
    out.print(f"this device now holds the key of vault {vault_id}: run `engram-sync sync`")


@team_app.command("pending")
def team_pending(
    json_out: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
) -> None:
    """Open key requests of the linked vault (admin), with their fingerprints."""
    from .._accounts import team

    with open_session() as session:
        requests = team.pending(session)
    rows = [
        {
            "request_id": r.request_id,
            "label": r.label,
            "fingerprint": r.fingerprint,
            "created_at": r.created_at,
            "expires_at": r.expires_at,
            "pairing_code": r.by_code,
        }
        for r in requests
    ]
    if json_out:
        print_json(rows)
        return
    if not requests:
        out.print("no open requests")
    for r in requests:
        how = "  (pairing code)" if r.by_code else ""
        out.print(
            f"{r.request_id}  {escape(r.fingerprint)}  {escape(r.label or '-')}  "
            f"until {r.expires_at}{how}"
        )


@team_app.command("approve")
def team_approve(
    request_id: Annotated[str, typer.Argument(help="The request id (`team pending`).")],
    yes: Annotated[
        bool, typer.Option("--yes", help="Skip the fingerprint question (not recommended).")
    ] = False,
) -> None:
    """Seal this device's vault key to a new device's request (PROTOCOL §14 step 4: by the
    pairing code this device issued, or after comparing fingerprints)."""
    from .._accounts import team

    with open_session() as session:
        request = team.find_pending(session, request_id)
        out.print(f"request {request.request_id} from {escape(request.label or '-')}")
        if request.by_code:
            out.print(
                "made with a pairing code: the code authenticates it, no fingerprint to compare"
            )
            team.approve(session, request)
            out.print(
                f"approved: the new device can now fetch the vault key (request {request_id})"
            )
            return
        out.print(f"    fingerprint: [bold]{escape(request.fingerprint)}[/bold]")
        if yes:
            err.print(
                "warning: --yes skips the fingerprint comparison; a relay that swapped the key "
                "would get the vault key"
            )
        elif not typer.confirm(
            "Does this match the code on the new device's screen?", default=False
        ):
            raise CliError("not approved: the fingerprints must match (nothing was sent)")
        approval = team.approve(session, request)
    out.print(f"approved: the new device can now fetch the vault key (request {request_id})")
    out.print("It shows this fingerprint of this device's key and asks whether it matches:")
    out.print()
    out.print(f"    [bold]{escape(approval.admin_fingerprint)}[/bold]")
    out.print()
    out.print(f"(for a script: `engram-sync team request --expect {approval.admin_fingerprint}`)")


# --- vault grants (PROTOCOL §13 "Vault ownership") ----------------------------------------------


@team_app.command(
    "grant",
    help="Let another account into the linked vault (needs this device's admin key).\n\n"
    "A vault id belongs to the account (or operator) that used it first; any other account "
    "gets `vault_owned` until an admin grants it. Once granted, its devices can keep the "
    "vault key in the account (`engram-sync vault open`) and link new devices with "
    "`engram-sync link --account`. The account must exist (`engram-sync account signup`); "
    "the vault key itself still travels by `team invite` / `team request`. A member grant "
    "(the default) mints member keys only; `--admin` (the owner's to give) may also mint "
    "admin keys, grant members and revoke devices; neither may retire the vault. "
    "Idempotent: a repeat sets the role.",
)
def team_grant(
    email: Annotated[
        str,
        typer.Argument(help="The account's email (or its account id, acct_…).", metavar="EMAIL"),
    ],
    admin: Annotated[
        bool,
        typer.Option(
            "--admin",
            help="An admin grant (only the vault's owner may give it). Without it: a member "
            "grant, which also turns an admin grant back into a member grant.",
        ),
    ] = False,
) -> None:
    from .._accounts import team_grants

    with open_session() as session:
        granted = team_grants.grant(session, email, admin=admin)
        vault_id = session.config.vault_id
    admin_now = granted.role == "admin"
    can = "mint admin keys, grant members, revoke devices" if admin_now else "mint member keys"
    out.print(
        f"granted vault {escape(vault_id or '')} to {escape(granted.email)} "
        f"({escape(granted.account_id)}) as {granted.role}: it can now {can} and keep its "
        "wrap there"
    )
    if admin_now and not admin:
        out.print(
            "note: this relay has no grant roles (no `grant-roles` in its features): there "
            "every grant can do what an admin can; `engram-sync team ungrant` removes it"
        )


@team_app.command("grants")
def team_grants_list(
    json_out: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
) -> None:
    """The accounts granted the linked vault, oldest first (needs this device's admin key).

    The vault's owner is not listed: it needs no grant.
    """
    from rich.table import Table

    from .._accounts import team_grants

    with open_session() as session:
        found = team_grants.grants(session)
        vault_id = session.config.vault_id or ""
    if json_out:
        print_json([{"account_id": g.account_id, "email": g.email, "role": g.role,
                     "granted_at": g.granted_at} for g in found])  # fmt: skip
        return
    if not found:
        out.print(f"no account is granted vault {escape(vault_id)}")
        return
    table = Table(title=f"grants of vault {escape(vault_id)}")
    table.add_column("email", overflow="fold")  # a long email wraps, never shortened
    table.add_column("account id", no_wrap=True)
    table.add_column("role", no_wrap=True)
    table.add_column("granted", no_wrap=True)  # the UTC day: wider, the email would fold
    for g in found:
        when = parse_rfc3339(g.granted_at).astimezone(UTC).strftime("%Y-%m-%d")
        table.add_row(escape(g.email), escape(g.account_id), g.role, when)
    out.print(table)


@team_app.command(
    "ungrant",
    help="Remove an account's grant of the linked vault (needs this device's admin key).\n\n"
    "It can no longer mint keys or store its wrap there, and the relay revokes every key it "
    "minted for the vault at once (PROTOCOL §13). Removing an admin's grant is the owner's.",
)
def team_ungrant(
    who: Annotated[
        str,
        typer.Argument(
            help="The account id or email, as `team grants` shows it.",
            metavar="ACCOUNT_ID_OR_EMAIL",
        ),
    ],
) -> None:
    from .._accounts import team_grants

    with open_session() as session:
        removed = team_grants.ungrant(session, who)
        vault_id = session.config.vault_id
    out.print(
        f"removed the grant of vault {escape(vault_id or '')} for {escape(removed.email)} "
        f"({escape(removed.account_id)}); the keys it minted for the vault are revoked"
    )
