"""A new device gets a vault without its sync passphrase: through the account (§13), through a
pairing code and the team key handoff (§14), and after a recovery. Wrong secrets change nothing.

Real relay and PostgreSQL, real SQLCipher vaults, real crypto, driven through the client
library (tests/e2e/test_account_cli.py drives the CLI).
"""

from __future__ import annotations

import hashlib
import queue
import threading
from pathlib import Path
from typing import Any

import pytest

from engram_sync.client._accounts import account, pairing, team
from engram_sync.client._errors import DeviceRevokedError
from engram_sync.client._session import VaultSession
from engram_sync.client._vault import vault_key_store as vault_keys
from engram_sync.shared_format.recovery import generate_recovery_phrase
from tests.e2e.conftest import DeviceHandle, make_device
from tests.e2e.helpers import add, contents, edit
from tests.relay.conftest import ADMIN_KEY, Relay

EMAIL = "Alice@Example.org"
PASSWORD = "alice's account password"
NEW_PASSWORD = "alice's brand new account password"


def new_device(tmp_path: Path, relay: Relay, name: str) -> DeviceHandle:
    """An empty vault with its own local passphrase (not the team's), not linked."""
    passphrase = f"{name}'s own local passphrase"
    VaultSession.open(tmp_path / name, passphrase, create=True).close()
    return DeviceHandle(name, tmp_path / name, relay, passphrase=passphrase)


def alpha_with_account(tmp_path: Path, relay: Relay) -> tuple[DeviceHandle, list[str]]:
    """Device alpha: passphrase vault linked with the operator key, two memories synced,
    signed up, and its vault key stored in the account (`vault open`)."""
    alpha = make_device(tmp_path, relay, "alpha")
    ids = [add(alpha, "Deploy with make ship"), add(alpha, "The staging DB is on port 5433")]
    alpha.sync()
    with alpha.open() as session:
        account.signup(session.path, relay.url, EMAIL, PASSWORD)
        assert account.open_vault(session, PASSWORD) == "team-e2e"
    return alpha, ids


def key_source(device: DeviceHandle) -> str:
    with device.open() as session:
        return vault_keys.key_source(session.vault.conn, session.config.vault_id)


def test_new_device_syncs_through_the_account(tmp_path: Path, relay: Relay) -> None:
    alpha, ids = alpha_with_account(tmp_path, relay)
    bravo = new_device(tmp_path, relay, "bravo")
    with bravo.open() as session:
        account.signin(session.path, relay.url, EMAIL.upper(), PASSWORD)
        assert account.link_with_account(session, relay.url, PASSWORD, label="bravo") == "team-e2e"
        assert session.config.api_key not in (None, ADMIN_KEY)  # its own device-bound key
        assert session.config.vault_id == "team-e2e"
    assert key_source(bravo) == "account"

    bravo.restart()  # from disk, as the next `engram-sync sync` would
    report = bravo.sync()
    assert report.invalid == 0
    assert contents(bravo) == contents(alpha)

    edit(bravo, ids[0], "Deploy with make ship-it")
    bravo.sync()
    alpha.sync()
    assert contents(alpha)[ids[0]] == "Deploy with make ship-it"
    [key] = relay.sql(
        "SELECT device_id FROM api_keys WHERE account_id IS NOT NULL AND revoked_at IS NULL"
    )
    with bravo.open() as session:
        assert key["device_id"] == session.device.device_id


def test_pairing_code_and_team_handoff(tmp_path: Path, relay: Relay) -> None:
    alpha = make_device(tmp_path, relay, "alpha")  # admin (operator key), holds K by passphrase
    memory = add(alpha, "Rotate the API keys every quarter")
    alpha.sync()
    with alpha.open() as session:
        code = pairing.issue_code(session, "charlie").code

    charlie = new_device(tmp_path, relay, "charlie")
    with charlie.open() as session:
        vault_id, has_key = pairing.link_with_code(session, relay.url, code.lower(), "charlie")
        assert (vault_id, has_key) == ("team-e2e", False)
        assert session.config.api_key != ADMIN_KEY
    assert key_source(charlie) == "missing"
    with pytest.raises(vault_keys.VaultKeyMissingError, match="team request"):
        charlie.sync()  # never encrypts under keys derived from its own passphrase
    with charlie.open() as session, pytest.raises(pairing.PairingError, match="ask the admin"):
        pairing.link_with_code(session, relay.url, code, "charlie")  # single use

    # The request outlives the command: a first run gives up waiting, the next one resumes.
    with charlie.open() as session, pytest.raises(team.TeamError, match="again to keep waiting"):
        team.request_key(session, wait=0)
    charlie.restart()

    shown: queue.Queue[team.Waiting] = queue.Queue()
    outcome: dict[str, Any] = {}

    def requester() -> None:
        try:
            with VaultSession.open(charlie.path, charlie.passphrase) as session:
                outcome["vault_id"] = team.request_key(
                    session, wait=60, poll=0.1, on_waiting=shown.put
                )
        except BaseException as exc:
            outcome["error"] = exc

    thread = threading.Thread(target=requester)
    thread.start()
    waiting = shown.get(timeout=30)
    assert waiting.resumed
    with alpha.open() as session:
        [listed] = team.pending(session)
        assert listed.fingerprint == waiting.fingerprint  # what the admin compares
        team.approve(session, team.find_pending(session, waiting.request_id))
    thread.join(timeout=60)
    assert outcome == {"vault_id": "team-e2e"}
    assert key_source(charlie) == "handoff"
    with charlie.open() as session:
        leftovers = session.vault.conn.execute("SELECT count(*) FROM sync_handoff_request")
        assert leftovers.fetchone()[0] == 0  # the ephemeral private key is gone

    charlie.sync()
    assert contents(charlie) == contents(alpha)
    assert contents(charlie)[memory] == "Rotate the API keys every quarter"
    with alpha.open() as session:
        assert team.pending(session) == []


def test_recovery_then_a_third_device_links_with_the_new_password(
    tmp_path: Path, relay: Relay
) -> None:
    alpha, _ = alpha_with_account(tmp_path, relay)
    with alpha.open() as session:
        phrase = account.set_recovery_phrase(session.path, PASSWORD)
    assert len(phrase.split()) == 12

    # The password is forgotten. A third device recovers with the phrase and links.
    delta = new_device(tmp_path, relay, "delta")
    account.recover(delta.path, relay.url, EMAIL, "  " + phrase.upper() + " ", NEW_PASSWORD)
    with delta.open() as session:
        account.link_with_account(session, relay.url, NEW_PASSWORD)
    delta.sync()
    assert contents(delta) == contents(alpha)

    with pytest.raises(account.AccountError, match="wrong email or account password"):
        account.signin(tmp_path / "scratch", relay.url, EMAIL, PASSWORD)
    # The recovery ended alpha's session: a command that needs the password signs in again.
    assert account.status(alpha.path)["session_valid"] is False
    new_phrase = account.set_recovery_phrase(alpha.path, NEW_PASSWORD)
    assert new_phrase != phrase
    assert account.status(alpha.path)["session_valid"] is True
    assert account.status(alpha.path)["vaults"] == ["team-e2e"]


def files(path: Path) -> dict[str, str]:
    """Digest of every file of a vault directory except the live database and its WAL."""
    return {
        p.name: hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(path.iterdir())
        if p.is_file() and not p.name.startswith("engrams.db")
    }


def relay_state(relay: Relay) -> list[Any]:
    tables = ["accounts", "account_wraps", "vault_wraps", "api_keys", "pairing_codes"]
    return [[dict(r) for r in relay.sql(f"SELECT * FROM {t} ORDER BY 1")] for t in tables]


def test_wrong_password_or_phrase_changes_nothing(tmp_path: Path, relay: Relay) -> None:
    alpha, _ = alpha_with_account(tmp_path, relay)
    with alpha.open() as session:
        account.set_recovery_phrase(session.path, PASSWORD)
    echo = new_device(tmp_path, relay, "echo")
    with echo.open() as session:
        account.signin(session.path, relay.url, EMAIL, PASSWORD)
    before_alpha, before_echo, before_relay = (
        files(alpha.path),
        files(echo.path),
        relay_state(relay),
    )
    wrong = PASSWORD + "!"

    with echo.open() as session:
        with pytest.raises(account.AccountError, match=r"^wrong account password$"):
            account.link_with_account(session, relay.url, wrong)
        assert vault_keys.stored_vault_key(session.vault.conn, "team-e2e") is None
        with pytest.raises(account.AccountError, match=r"^wrong email or account password$"):
            account.signin(session.path, relay.url, EMAIL, wrong)
        with pytest.raises(account.AccountError, match=r"^wrong account password$"):
            account.set_recovery_phrase(session.path, wrong)
        with pytest.raises(account.AccountError, match="does not open the account"):
            account.recover(session.path, relay.url, EMAIL, generate_recovery_phrase(), wrong)
        with pytest.raises(account.AccountError, match="checksum"):
            account.recover(session.path, relay.url, EMAIL, "abandon " * 12, wrong)
        with pytest.raises(pairing.PairingError, match="invalid, used or expired"):
            pairing.link_with_code(session, relay.url, "ENG-0000-0000-0000")
    with alpha.open() as session:
        with pytest.raises(account.AccountError, match=r"^wrong account password$"):
            account.open_vault(session, wrong)
        with pytest.raises(account.AccountError, match=r"^wrong account password$"):
            account.close_vault(session.path, wrong)

    assert files(alpha.path) == before_alpha
    assert files(echo.path) == before_echo
    assert relay_state(relay) == before_relay
    with echo.open() as session:  # and the right password still works
        assert account.link_with_account(session, relay.url, PASSWORD) == "team-e2e"


@pytest.mark.parametrize("when", ["after a sync said revoked", "before any sync"])
def test_a_revoked_device_links_again_through_the_account_under_a_new_id(
    tmp_path: Path, relay: Relay, when: str
) -> None:
    """Issue 31: the way back the revocation message gives works with `link --account` too:
    a new device id (the old one stays revoked on the relay), the waiting edit pushed."""
    alpha, _ = alpha_with_account(tmp_path, relay)
    bravo = new_device(tmp_path, relay, "bravo")
    with bravo.open() as session:
        account.signin(session.path, relay.url, EMAIL, PASSWORD)
        account.link_with_account(session, relay.url, PASSWORD, label="bravo")
        old = session.device.device_id
    bravo.sync()
    with alpha.relay_client() as admin:
        admin.revoke_device("team-e2e", old)
    waiting = add(bravo, "written after the revocation")
    if when == "after a sync said revoked":
        with pytest.raises(DeviceRevokedError):
            bravo.sync()  # its device-bound key gets 403 on the pull (PROTOCOL §10)

    with bravo.open() as session:
        assert account.link_with_account(session, relay.url, PASSWORD) == "team-e2e"
        renewed = session.device.device_id
    assert renewed != old
    bravo.restart()
    assert bravo.sync().pushed == 1
    alpha.sync()
    assert contents(alpha)[waiting] == "written after the revocation"
    with alpha.relay_client() as admin:
        roster = {d.device_id: d.revoked for d in admin.devices("team-e2e").devices}
    assert (roster[old], roster[renewed]) == (True, False)


def test_a_revoked_device_pairs_again_under_a_new_id(tmp_path: Path, relay: Relay) -> None:
    """Issue 31: a pairing code redeemed for a revoked device id is refused and left unused
    (relay.store.pairing); the device takes a new id and redeems it, once."""
    alpha = make_device(tmp_path, relay, "alpha")
    charlie = new_device(tmp_path, relay, "charlie")
    with alpha.open() as session:
        first = pairing.issue_code(session, "charlie").code
    with charlie.open() as session:
        pairing.link_with_code(session, relay.url, first, "charlie")
        old = session.device.device_id
    with alpha.relay_client() as admin:
        admin.revoke_device("team-e2e", old)
    with alpha.open() as session:
        second = pairing.issue_code(session, "charlie").code
    with charlie.open() as session:
        assert pairing.link_with_code(session, relay.url, second, "charlie") == ("team-e2e", False)
        renewed = session.device.device_id
        assert not session.state.revoked
    assert renewed != old
    with alpha.relay_client() as admin:
        roster = {d.device_id: d.revoked for d in admin.devices("team-e2e").devices}
    assert (roster[old], roster[renewed]) == (True, False)
