"""Account recovery with the 12-word phrase (PROTOCOL §13, our authorisation design).

End to end with real crypto on the client side: the phrase opens the recovery
wrap, A is re-wrapped under a new password, the relay checks only SHA-256 of a
proof derived from the recovery wrap key, and the new password signs in.
"""

from __future__ import annotations

import os

from engram_sync.shared_format.b64 import b64decode_std, b64encode_std
from engram_sync.shared_format.recovery import generate_recovery_phrase, validate_recovery_phrase
from engram_sync.shared_format.recovery_proof import (
    open_recovery_wrap,
    recovery_proof,
    recovery_verifier,
    wrap_for_recovery,
)
from engram_sync.shared_format.wraps import (
    new_account_key,
    pack_vault_key,
    unwrap_vault_key,
    unwrap_with_secret,
    wrap_vault_key,
    wrap_with_secret,
)
from tests.relay.accounts.helpers import PASSWORD, http, signin, signup
from tests.relay.conftest import Relay
from tests.relay.support import assert_error, new_vault_id

NEW_PASSWORD = "a brand new passphrase"


def test_recovery_end_to_end(served: Relay) -> None:
    account = signup(served)
    a = new_account_key()
    phrase = generate_recovery_phrase()
    wrapped_a, salt_pw = wrap_with_secret(a, PASSWORD)
    rec = wrap_for_recovery(a, phrase)
    vault_id = new_vault_id("rec")
    k = pack_vault_key(os.urandom(32), os.urandom(32), vault_id)
    with account.client(served) as c:
        for path, body in [
            (
                "/account/wraps/password",
                {"wrapped_a": b64encode_std(wrapped_a), "salt_pw": b64encode_std(salt_pw)},
            ),
            ("/account/wraps/recovery", rec.wire()),
            (
                f"/account/vaults/{vault_id}/wrap",
                {"wrapped_k": b64encode_std(wrap_vault_key(k, a))},
            ),
        ]:
            response = c.put(path, json={**body, "password": PASSWORD})
            assert response.status_code == 200, response.text
        assert (
            c.get("/account/wraps/recovery").json()["wrapped_a_rec"] == rec.wire()["wrapped_a_rec"]
        )
    other_session = signin(served, account.email, PASSWORD).json()["session_token"]

    # The person forgot the password; on a new device they type the email and the phrase.
    typed = "  " + phrase.upper().replace(" ", "   ") + " "
    with http(served) as c:
        start = c.post("/auth/recover/start", json={"email": account.email.upper()})
        assert start.status_code == 200, start.text
        material = start.json()
        opened_a, proof = open_recovery_wrap(
            b64decode_std(material["wrapped_a_rec"]),
            b64decode_std(material["salt_rec"]),
            validate_recovery_phrase(typed),
        )
        assert opened_a == a
        new_wrap, new_salt = wrap_with_secret(opened_a, NEW_PASSWORD)
        recovered = c.post(
            "/auth/recover",
            json={
                "email": account.email,
                "proof": b64encode_std(proof),
                "new_password": NEW_PASSWORD,
                "wrapped_a": b64encode_std(new_wrap),
                "salt_pw": b64encode_std(new_salt),
            },
        )
    assert recovered.status_code == 200, recovered.text
    assert recovered.json()["account_id"] == account.account_id

    # Old sessions ended, the old password is gone, the new one signs in and unwraps A → K.
    for token in (account.token, other_session):
        with http(served, token) as c:
            assert_error(c.get("/account"), 401, "unauthorized")
    assert_error(signin(served, account.email, PASSWORD), 401, "invalid_credentials")
    fresh = signin(served, account.email, NEW_PASSWORD)
    assert fresh.status_code == 200, fresh.text
    with http(served, fresh.json()["session_token"]) as c:
        wraps = c.get("/account/wraps/password").json()
        wrapped_k = c.get(f"/account/vaults/{vault_id}/wrap").json()["wrapped_k"]
    a_again = unwrap_with_secret(
        b64decode_std(wraps["wrapped_a"]), b64decode_std(wraps["salt_pw"]), NEW_PASSWORD
    )
    assert a_again == a
    assert unwrap_vault_key(b64decode_std(wrapped_k), a_again, vault_id).vault_id == vault_id
    stored = served.sql(
        "SELECT rec_verifier FROM account_wraps WHERE account_id = $1", account.account_id
    )
    assert bytes(stored[0]["rec_verifier"]) == recovery_verifier(proof) == rec.verifier


def test_recovery_refuses_a_wrong_proof_and_changes_nothing(served: Relay) -> None:
    account = signup(served)
    verifier = recovery_verifier(recovery_proof(b"\x07" * 32))
    rec = {
        "wrapped_a_rec": b64encode_std(bytes(60)),
        "salt_rec": b64encode_std(bytes(16)),
        "recovery_verifier": b64encode_std(verifier),
        "password": PASSWORD,
    }
    with account.client(served) as c:
        assert c.put("/account/wraps/recovery", json=rec).status_code == 200
    before = served.sql("SELECT * FROM accounts WHERE id = $1", account.account_id)
    attempt = {
        "email": account.email,
        "proof": b64encode_std(recovery_proof(b"\x08" * 32)),  # a wrong phrase's proof
        "new_password": NEW_PASSWORD,
        "wrapped_a": b64encode_std(bytes(60)),
        "salt_pw": b64encode_std(bytes(16)),
    }
    with http(served) as c:
        wrong = c.post("/auth/recover", json=attempt)
        unknown = c.post("/auth/recover", json={**attempt, "email": "nobody@example.org"})
        # the verifier itself is not the proof (a leaked verifier does not recover)
        replay = c.post("/auth/recover", json={**attempt, "proof": b64encode_std(verifier)})
        short = c.post("/auth/recover", json={**attempt, "proof": b64encode_std(bytes(31))})
    assert_error(wrong, 403, "recovery_failed")
    assert_error(replay, 403, "recovery_failed")
    assert (unknown.status_code, unknown.json()) == (wrong.status_code, wrong.json())
    assert assert_error(short, 400, "invalid_request")["field"] == "proof"
    assert served.sql("SELECT * FROM accounts WHERE id = $1", account.account_id) == before
    with account.client(served) as c:
        assert c.get("/account").status_code == 200

    # The right proof works (and the relay never needed the phrase or A to check it).
    with http(served) as c:
        ok = c.post(
            "/auth/recover", json={**attempt, "proof": b64encode_std(recovery_proof(b"\x07" * 32))}
        )
    assert ok.status_code == 200, ok.text


def test_recovery_start_without_a_recovery_wrap(served: Relay) -> None:
    account = signup(served)
    with http(served) as c:
        none = c.post("/auth/recover/start", json={"email": account.email})
        unknown = c.post("/auth/recover/start", json={"email": "nobody@example.org"})
    assert_error(none, 404, "recovery_unavailable")
    assert (unknown.status_code, unknown.json()) == (none.status_code, none.json())


def test_recovery_wrap_needs_a_verifier(served: Relay) -> None:
    account = signup(served)
    with account.client(served) as c:
        response = c.put(
            "/account/wraps/recovery",
            json={
                "wrapped_a_rec": b64encode_std(bytes(60)),
                "salt_rec": b64encode_std(bytes(16)),
                "password": PASSWORD,
            },
        )
    assert assert_error(response, 400, "invalid_request")["field"] == "recovery_verifier"
