"""A relay that lies during the team key handoff (PROTOCOL §14 step 4, issue 13 item 1).

The relay knows the requester's ephemeral public key, so it can seal a K' of its own
choosing to it, or swap the admin's public key, or replace the requester's key and
SPAKE2 message before the admin sees them. Each attack here must end in "refused,
nothing stored" on the new device (and, where the admin's seal is concerned, in a
seal the relay cannot open), and each has its honest counterpart through the same
proxy that succeeds.

The real relay process behind the hostile proxy, real SQLCipher vaults, real P-256 /
AES-GCM / SPAKE2, driven through the client library (tests/e2e/test_account_cli.py
drives the CLI).
"""

from __future__ import annotations

import contextlib
import json
from typing import Any

import pytest

from engram_sync.client._accounts import pairing, team
from engram_sync.client._vault import vault_key_store as vault_keys
from engram_sync.shared_format.b64 import b64url_encode
from engram_sync.shared_format.errors import HandoffError
from engram_sync.shared_format.handoff import (
    decode_public_key,
    decode_sealed,
    new_handoff_keypair,
    open_sealed_vault_key,
    public_key_fingerprint,
    seal_vault_key,
)
from engram_sync.shared_format.handoff_pake import (
    RequesterPake,
    decode_pake_message,
    pake_password,
    seal_vault_key_with_code,
)
from engram_sync.shared_format.pairing import parse_pairing_code, with_secret
from engram_sync.shared_format.wraps import pack_vault_key
from tests.e2e.conftest import DeviceHandle
from tests.e2e.helpers import add, contents
from tests.e2e.hostile.conftest import Scene
from tests.e2e.hostile.proxy import Action, Answer, Exchange, HostileProxy, rewrite_json

HANDOFF = r"/handoff$"  # POST: the request (public key, SPAKE2 message); GET: the list
SEAL = r"/handoff/[^/]+/seal$"
CLAIM = r"/handoff/[^/]+/claim$"


def requester_public_key(proxy: HostileProxy) -> bytes:
    """What the relay learnt from the handoff request: the requester's public key."""
    sent = proxy.requests("POST", HANDOFF)
    assert sent, "no handoff request went through the relay"
    return decode_public_key(sent[0].request_json()["public_key"])


def seal_posted(proxy: HostileProxy) -> dict[str, str]:
    sent = proxy.requests("POST", SEAL)
    assert sent, "no seal went through the relay"
    body: dict[str, str] = sent[0].request_json()
    return body


def everything_seen(proxy: HostileProxy) -> str:
    """All the relay was sent and answered through the proxy: paths, queries, bodies as
    they were and, where they are JSON, as decoded."""
    seen: list[str] = []
    for e in list(proxy.log):
        seen += [e.method, e.path, json.dumps(e.query)]
        for raw in (e.request_body, e.body):
            seen.append(raw.decode("utf-8", "replace"))
            with contextlib.suppress(ValueError):  # not JSON
                seen.append(json.dumps(json.loads(raw)))
    return "\n".join(seen)


def setup(
    scene: Scene, *, with_secret_part: bool = True, blobs: bool = True, through_proxy: bool = True
) -> tuple[DeviceHandle, DeviceHandle, str]:
    """Admin alpha (holds K by passphrase, operator key) and new device charlie linked by
    a pairing code (the whole code, or only the relay's part), both through the proxy (or
    both straight to the relay)."""
    alpha = scene.device("alpha", through_proxy=through_proxy)
    if blobs:
        add(alpha, "Rotate the API keys every quarter")
        alpha.sync()
    with alpha.open() as session:
        code = pairing.issue_code(session, "charlie").code
    typed = code if with_secret_part else parse_pairing_code(code).relay_code
    charlie = new_device(scene, "charlie", through_proxy=through_proxy)
    with charlie.open() as session:
        pairing.link_with_code(session, charlie.relay.url, typed, "charlie")
    return alpha, charlie, code


def new_device(scene: Scene, name: str, *, through_proxy: bool = True) -> DeviceHandle:
    return scene.blank_device(name, f"{name}'s own local passphrase", through_proxy=through_proxy)


def ask(charlie: DeviceHandle, **options: Any) -> team.Waiting:
    """`team request` that gives up waiting at once (the request stays open)."""
    shown: list[team.Waiting] = []
    with charlie.open() as session, pytest.raises(team.TeamError, match="keep waiting"):
        team.request_key(session, wait=0, on_waiting=shown.append, **options)
    return shown[0]


def approve(alpha: DeviceHandle, request_id: str) -> team.Approval:
    with alpha.open() as session:
        return team.approve(session, team.find_pending(session, request_id))


def claim(charlie: DeviceHandle, **options: Any) -> str:
    with charlie.open() as session:
        return team.request_key(session, wait=0, **options)


def assert_nothing_stored(scene: Scene, charlie: DeviceHandle) -> None:
    with charlie.open() as session:
        conn = session.vault.conn
        assert vault_keys.stored_vault_key(conn, scene.vault_id) is None
        assert vault_keys.key_source(conn, scene.vault_id) == "missing"
        for table in ("sync_vault_key", "sync_handoff_request", "sync_handoff_pake"):
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0, table
    with pytest.raises(vault_keys.VaultKeyMissingError):
        charlie.sync()


def assert_holds_k(scene: Scene, charlie: DeviceHandle, alpha: DeviceHandle) -> None:
    with charlie.open() as session:
        assert vault_keys.key_source(session.vault.conn, scene.vault_id) == "handoff"
        left = session.vault.conn.execute("SELECT count(*) FROM sync_pairing_code").fetchone()
        assert left[0] == 0  # the whole code is gone once used
    charlie.sync()
    assert contents(charlie) == contents(alpha)


def forged_k(scene: Scene) -> bytes:
    """A K' of the relay's choosing, for the right vault id (so the suffix check passes)."""
    return pack_vault_key(b"\x01" * 32, b"\x02" * 32, scene.vault_id)


def seal_own_k(scene: Scene) -> Action:
    """The claim answer with K' sealed to the requester's public key instead."""

    def forge(got: Any) -> Any:
        made = seal_vault_key(requester_public_key(scene.proxy), forged_k(scene))
        return {**got, **made.to_wire()}

    return rewrite_json(forge)


# --- member-request path (no secret part: fingerprints) ----------------------------------


def test_member_path_honest_relay(scene: Scene) -> None:
    alpha, charlie, _ = setup(scene, with_secret_part=False)
    waiting = ask(charlie)
    assert not waiting.by_code
    with alpha.open() as session:
        [listed] = team.pending(session)
    assert listed.fingerprint == waiting.fingerprint  # the admin compares
    approval = approve(alpha, waiting.request_id)
    assert not approval.by_code
    expect = approval.admin_fingerprint.lower().replace("-", "")
    assert claim(charlie, expect=expect) == scene.vault_id
    assert_holds_k(scene, charlie, alpha)


def test_member_path_confirm_prompt_honest(scene: Scene) -> None:
    alpha, charlie, _ = setup(scene, with_secret_part=False)
    waiting = ask(charlie)
    approval = approve(alpha, waiting.request_id)
    shown: list[str] = []

    def confirm(fingerprint: str) -> bool:  # the person compares with the admin's screen
        shown.append(fingerprint)
        return fingerprint == approval.admin_fingerprint

    claim(charlie, confirm=confirm)
    assert shown == [approval.admin_fingerprint]
    assert_holds_k(scene, charlie, alpha)


def test_member_path_without_a_way_to_confirm_claims_nothing(scene: Scene) -> None:
    alpha, charlie, _ = setup(scene, with_secret_part=False)
    waiting = ask(charlie)
    approval = approve(alpha, waiting.request_id)
    with pytest.raises(team.TeamError, match="--expect FINGERPRINT"):
        claim(charlie)
    assert scene.proxy.requests("POST", CLAIM) == []  # the seal stays on the relay
    with charlie.open() as session:
        assert vault_keys.key_source(session.vault.conn, scene.vault_id) == "missing"
    assert claim(charlie, expect=approval.admin_fingerprint) == scene.vault_id  # and finished
    assert_holds_k(scene, charlie, alpha)


@pytest.mark.parametrize("blobs", [True, False])
def test_member_path_relay_seals_its_own_k(scene: Scene, blobs: bool) -> None:
    """The relay answers the claim with K' sealed to the requester's public key. The admin
    key's fingerprint differs from the admin's screen: refused (with and without blobs)."""
    alpha, charlie, _ = setup(scene, with_secret_part=False, blobs=blobs)
    attacker_seal: dict[str, str] = {}

    def forge(exchange: Exchange) -> Answer:
        made = seal_vault_key(requester_public_key(scene.proxy), forged_k(scene))
        attacker_seal.update(made.to_wire())
        return Answer(exchange.status, {**exchange.json(), **made.to_wire()})

    scene.proxy.on("POST", CLAIM, forge)
    waiting = ask(charlie)
    approval = approve(alpha, waiting.request_id)
    with pytest.raises(team.TeamError, match="REFUSED") as refused:
        claim(charlie, expect=approval.admin_fingerprint)
    forged_fingerprint = public_key_fingerprint(decode_public_key(attacker_seal["public_key"]))
    message = str(refused.value)
    assert "Nothing was stored" in message
    if blobs:
        # Defence in depth caught it first: K' opens none of the vault's blobs.
        assert "verifies none of the blobs" in message
    else:
        assert forged_fingerprint in message
        assert approval.admin_fingerprint in message
    assert_nothing_stored(scene, charlie)


def test_member_path_prompt_refuses_a_relay_k(scene: Scene) -> None:
    """Same forgery on an empty vault, with the person answering the prompt honestly."""
    alpha, charlie, _ = setup(scene, with_secret_part=False, blobs=False)
    scene.proxy.on("POST", CLAIM, seal_own_k(scene))
    waiting = ask(charlie)
    approval = approve(alpha, waiting.request_id)
    with pytest.raises(team.TeamError, match="was not confirmed"):
        claim(charlie, confirm=lambda fp: fp == approval.admin_fingerprint)
    assert_nothing_stored(scene, charlie)


def test_member_path_blob_check_refuses_k_even_if_confirmed(scene: Scene) -> None:
    """Defence in depth (§14 step 4): the person wrongly confirms, the vault holds blobs,
    K' verifies none of them: refused loudly, nothing stored."""
    alpha, charlie, _ = setup(scene, with_secret_part=False)
    scene.proxy.on("POST", CLAIM, seal_own_k(scene))
    waiting = ask(charlie)
    approve(alpha, waiting.request_id)
    with pytest.raises(team.TeamError, match="verifies none of the blobs"):
        claim(charlie, confirm=lambda fp: True)
    assert_nothing_stored(scene, charlie)


def test_member_path_swapped_admin_key(scene: Scene) -> None:
    alpha, charlie, _ = setup(scene, with_secret_part=False)
    other = new_handoff_keypair().public_key_b64url
    scene.proxy.on("POST", CLAIM, rewrite_json(lambda got: {**got, "public_key": other}))
    waiting = ask(charlie)
    approval = approve(alpha, waiting.request_id)
    with pytest.raises(team.TeamError, match="REFUSED"):
        claim(charlie, expect=approval.admin_fingerprint)
    assert_nothing_stored(scene, charlie)


# --- pairing-code path (the secret part authenticates) -----------------------------------


def test_code_path_honest_relay(scene: Scene) -> None:
    alpha, charlie, code = setup(scene)
    secret = parse_pairing_code(code).secret
    assert secret is not None
    waiting = ask(charlie)
    assert waiting.by_code
    with alpha.open() as session:
        [listed] = team.pending(session)
        assert listed.by_code
        assert team.has_code_for(session, listed)
    approval = approve(alpha, waiting.request_id)
    assert approval.by_code
    with alpha.open() as session:  # one exchange per code: the admin's copy is gone
        assert (
            session.vault.conn.execute("SELECT count(*) FROM sync_pairing_code").fetchone()[0] == 0
        )
    assert claim(charlie) == scene.vault_id  # no fingerprint to confirm
    assert_holds_k(scene, charlie, alpha)
    # The relay saw the first part of the code only, never the secret part.
    everything = everything_seen(scene.proxy)
    assert scene.proxy.requests("POST", CLAIM)  # the whole handoff went through the proxy
    assert secret not in everything
    assert secret.replace("-", "") not in everything


def test_code_path_relay_seals_its_own_k(scene: Scene) -> None:
    """K' sealed to the requester's key with a SPAKE2 message and auth made under a guessed
    secret part (the relay's one online guess), or with the authentication stripped."""
    alpha, charlie, code = setup(scene, blobs=False)  # no blob check to help
    guess = with_secret(parse_pairing_code(code).relay_code, "0000-0000")

    def forge(got: Any) -> Any:
        [request] = scene.proxy.requests("POST", HANDOFF)
        made = seal_vault_key_with_code(
            pake_password(guess),
            got["request_id"],
            requester_public_key(scene.proxy),
            decode_pake_message(request.request_json()["pake"], b"B"),
            forged_k(scene),
        )
        return {**got, **made.to_wire()}

    scene.proxy.on("POST", CLAIM, rewrite_json(forge))
    waiting = ask(charlie)
    approve(alpha, waiting.request_id)
    with pytest.raises(team.TeamError, match="not authenticated by this pairing code"):
        claim(charlie)
    assert_nothing_stored(scene, charlie)


def test_code_path_relay_strips_the_authentication(scene: Scene) -> None:
    alpha, charlie, _ = setup(scene, blobs=False)

    def forge(got: Any) -> Any:
        plain = seal_vault_key(requester_public_key(scene.proxy), forged_k(scene)).to_wire()
        return {"request_id": got["request_id"], "vault_id": got["vault_id"], **plain}

    scene.proxy.on("POST", CLAIM, rewrite_json(forge))
    waiting = ask(charlie)
    approve(alpha, waiting.request_id)
    with pytest.raises(team.TeamError, match="not authenticated by the pairing code"):
        claim(charlie)
    assert_nothing_stored(scene, charlie)


def test_code_path_swapped_admin_key(scene: Scene) -> None:
    alpha, charlie, _ = setup(scene)
    other = new_handoff_keypair().public_key_b64url
    scene.proxy.on("POST", CLAIM, rewrite_json(lambda got: {**got, "public_key": other}))
    waiting = ask(charlie)
    approve(alpha, waiting.request_id)
    with pytest.raises(team.TeamError, match="not authenticated by this pairing code"):
        claim(charlie)
    assert_nothing_stored(scene, charlie)


def test_code_path_relay_replacing_the_requester_gets_nothing(scene: Scene) -> None:
    """The relay hands the admin its own public key and a SPAKE2 message under a guessed
    secret part: the seal the admin posts does not open for the relay, and the real
    requester refuses it."""
    alpha, charlie, code = setup(scene)
    attacker = new_handoff_keypair()
    guess = RequesterPake.start(
        pake_password(with_secret(parse_pairing_code(code).relay_code, "0000-0000"))
    )

    def swap(got: Any) -> Any:
        return {
            **got,
            "requests": [
                {
                    **r,
                    "public_key": attacker.public_key_b64url,
                    "fingerprint": attacker.fingerprint,
                    "pake": b64url_encode(guess.message),
                }
                for r in got["requests"]
            ],
        }

    scene.proxy.on("GET", HANDOFF, rewrite_json(swap))
    waiting = ask(charlie)
    approve(alpha, waiting.request_id)
    posted = seal_posted(scene.proxy)
    keys = guess.finish(decode_pake_message(posted["pake"], b"A"))
    for binding in (keys.binding, None):
        with pytest.raises(HandoffError, match="does not open"):
            open_sealed_vault_key(
                attacker,
                decode_public_key(posted["public_key"]),
                decode_sealed(posted["sealed"]),
                binding=binding,
            )
    with pytest.raises(team.TeamError, match="not authenticated by this pairing code"):
        claim(charlie)
    assert_nothing_stored(scene, charlie)


# --- no lie: straight to the relay ---------------------------------------------------------


def test_code_path_wrong_secret_part(scene: Scene) -> None:
    alpha = scene.device("alpha", through_proxy=False)
    with alpha.open() as session:
        code = parse_pairing_code(pairing.issue_code(session, "charlie").code)
    assert code.secret is not None
    wrong = "ZZZZ-ZZZZ" if code.secret != "ZZZZ-ZZZZ" else "YYYY-YYYY"
    charlie = new_device(scene, "charlie", through_proxy=False)
    with charlie.open() as session:
        pairing.link_with_code(session, scene.relay.url, f"{code.relay_code}-{wrong}", "charlie")
    waiting = ask(charlie)
    approve(alpha, waiting.request_id)
    with pytest.raises(team.TeamError, match="mistyped secret part"):
        claim(charlie)
    assert_nothing_stored(scene, charlie)
    # Without the code, the two compare fingerprints instead, and it works.
    waiting = ask(charlie)
    assert not waiting.by_code
    approval = approve(alpha, waiting.request_id)
    claim(charlie, expect=approval.admin_fingerprint)
    assert_holds_k(scene, charlie, alpha)


def test_admin_without_the_code_refuses_to_seal(scene: Scene) -> None:
    """A request naming a code this admin device did not issue (or already used)."""
    alpha, charlie, _ = setup(scene, through_proxy=False)
    with alpha.open() as session, session.vault.transaction() as conn:
        conn.execute("DELETE FROM sync_pairing_code")
    waiting = ask(charlie)
    with pytest.raises(team.TeamError, match="did not issue"):
        approve(alpha, waiting.request_id)
    # --no-code withdraws the request and goes by fingerprints.
    waiting = ask(charlie, use_code=False)
    assert not waiting.by_code
    approval = approve(alpha, waiting.request_id)
    claim(charlie, expect=approval.admin_fingerprint)
    assert_holds_k(scene, charlie, alpha)
