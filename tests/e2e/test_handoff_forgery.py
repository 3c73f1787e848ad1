"""A relay that lies during the team key handoff (PROTOCOL §14 step 4, issue 13 item 1).

The relay knows the requester's ephemeral public key, so it can seal a K' of its own
choosing to it, or swap the admin's public key, or replace the requester's key and
SPAKE2 message before the admin sees them. Each attack here must end in "refused,
nothing stored" on the new device (and, where the admin's seal is concerned, in a
seal the relay cannot open), and each has its honest counterpart through the same
proxy that succeeds.

Real relay (uvicorn + PostgreSQL) behind a small rewriting HTTP proxy on loopback,
real SQLCipher vaults, real P-256 / AES-GCM / SPAKE2, driven through the client
library (tests/e2e/test_account_cli.py drives the CLI).
"""

from __future__ import annotations

import json
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any

import httpx
import pytest

from client import pairing, team, vault_keys
from client.session import VaultSession
from shared_format.b64 import b64url_encode
from shared_format.errors import HandoffError
from shared_format.handoff import (
    decode_public_key,
    decode_sealed,
    new_handoff_keypair,
    open_sealed_vault_key,
    public_key_fingerprint,
    seal_vault_key,
)
from shared_format.handoff_pake import (
    RequesterPake,
    decode_pake_message,
    pake_password,
    seal_vault_key_with_code,
)
from shared_format.pairing import parse_pairing_code, with_secret
from shared_format.wraps import pack_vault_key
from tests.e2e.conftest import VAULT_ID, DeviceHandle, make_device
from tests.e2e.helpers import add, contents
from tests.relay.conftest import Relay

# (method, path, request JSON or None, answer JSON) -> the answer to send instead, or None.
Rewrite = Callable[[str, str, Any, Any], Any]


@dataclass
class LyingRelay:
    """An HTTP proxy in front of the real relay; `rewrite` may replace any JSON answer.

    It also remembers what passed through (`seen`), as a relay would.
    """

    upstream: str
    rewrite: Rewrite | None = None
    seen: list[tuple[str, str, Any, Any]] = field(default_factory=list)

    def start(self) -> tuple[ThreadingHTTPServer, str]:
        proxy = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, format: str, *args: Any) -> None:
                return

            def _forward(self) -> None:
                length = int(self.headers.get("content-length") or 0)
                body = self.rfile.read(length) if length else b""
                headers = {
                    k: v
                    for k, v in self.headers.items()
                    if k.lower() not in ("host", "content-length", "connection")
                }
                with httpx.Client(base_url=proxy.upstream, timeout=30) as upstream:
                    answer = upstream.request(
                        self.command, self.path, content=body, headers=headers
                    )
                content = answer.content
                path = self.path.split("?")[0]
                try:
                    sent = json.loads(body) if body else None
                    got = answer.json()
                except ValueError:
                    sent = got = None
                proxy.seen.append((self.command, path, sent, got))
                if got is not None and proxy.rewrite is not None:
                    replaced = proxy.rewrite(self.command, path, sent, got)
                    if replaced is not None:
                        content = json.dumps(replaced).encode()
                self.send_response(answer.status_code)
                self.send_header("content-type", answer.headers.get("content-type", "text/plain"))
                self.send_header("content-length", str(len(content)))
                self.send_header("connection", "close")
                self.end_headers()
                self.wfile.write(content)

            do_GET = do_POST = do_PUT = do_DELETE = _forward  # noqa: N815 (http.server names)

        server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        return server, f"http://127.0.0.1:{server.server_address[1]}"

    def requester_public_key(self) -> bytes:
        """What the relay learnt from the handoff request: the requester's public key."""
        for method, path, sent, _ in self.seen:
            if method == "POST" and path.endswith("/handoff"):
                return decode_public_key(sent["public_key"])
        raise AssertionError("no handoff request went through the relay")

    def seal_posted(self) -> dict[str, str]:
        for method, path, sent, _ in self.seen:
            if method == "POST" and path.endswith("/seal"):
                body: dict[str, str] = sent
                return body
        raise AssertionError("no seal went through the relay")


@pytest.fixture
def lying(relay: Relay) -> Iterator[tuple[LyingRelay, Relay]]:
    """The proxy and a `Relay` whose url is the proxy's (devices link to it)."""
    liar = LyingRelay(relay.url)
    server, url = liar.start()
    try:
        yield liar, Relay(url, relay.database_url, relay.config)
    finally:
        server.shutdown()
        server.server_close()


def new_device(tmp_path: Path, relay: Relay, name: str) -> DeviceHandle:
    passphrase = f"{name}'s own local passphrase"
    VaultSession.open(tmp_path / name, passphrase, create=True).close()
    return DeviceHandle(name, tmp_path / name, relay, passphrase=passphrase)


def setup(
    tmp_path: Path, via: Relay, *, with_secret_part: bool = True, blobs: bool = True
) -> tuple[DeviceHandle, DeviceHandle, str]:
    """Admin alpha (holds K by passphrase, operator key) and new device charlie linked by
    a pairing code (the whole code, or only the relay's part), both through `via`."""
    alpha = make_device(tmp_path, via, "alpha")
    if blobs:
        add(alpha, "Rotate the API keys every quarter")
        alpha.sync()
    with alpha.open() as session:
        code = pairing.issue_code(session, "charlie").code
    typed = code if with_secret_part else parse_pairing_code(code).relay_code
    charlie = new_device(tmp_path, via, "charlie")
    with charlie.open() as session:
        pairing.link_with_code(session, via.url, typed, "charlie")
    return alpha, charlie, code


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


def assert_nothing_stored(charlie: DeviceHandle) -> None:
    with charlie.open() as session:
        conn = session.vault.conn
        assert vault_keys.stored_vault_key(conn, VAULT_ID) is None
        assert vault_keys.key_source(conn, VAULT_ID) == "missing"
        for table in ("sync_vault_key", "sync_handoff_request", "sync_handoff_pake"):
            assert conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0] == 0, table
    with pytest.raises(vault_keys.VaultKeyMissingError):
        charlie.sync()


def assert_holds_k(charlie: DeviceHandle, alpha: DeviceHandle) -> None:
    with charlie.open() as session:
        assert vault_keys.key_source(session.vault.conn, VAULT_ID) == "handoff"
        left = session.vault.conn.execute("SELECT count(*) FROM sync_pairing_code").fetchone()
        assert left[0] == 0  # the whole code is gone once used
    charlie.sync()
    assert contents(charlie) == contents(alpha)


def forged_k() -> bytes:
    """A K' of the relay's choosing, for the right vault id (so the suffix check passes)."""
    return pack_vault_key(b"\x01" * 32, b"\x02" * 32, VAULT_ID)


def is_claim(method: str, path: str) -> bool:
    return method == "POST" and path.endswith("/claim")


# --- member-request path (no secret part: fingerprints) ----------------------------------


def test_member_path_honest_relay(tmp_path: Path, lying: tuple[LyingRelay, Relay]) -> None:
    _, via = lying
    alpha, charlie, _ = setup(tmp_path, via, with_secret_part=False)
    waiting = ask(charlie)
    assert not waiting.by_code
    with alpha.open() as session:
        [listed] = team.pending(session)
    assert listed.fingerprint == waiting.fingerprint  # the admin compares
    approval = approve(alpha, waiting.request_id)
    assert not approval.by_code
    assert claim(charlie, expect=approval.admin_fingerprint.lower().replace("-", "")) == VAULT_ID
    assert_holds_k(charlie, alpha)


def test_member_path_confirm_prompt_honest(tmp_path: Path, lying: tuple[LyingRelay, Relay]) -> None:
    _, via = lying
    alpha, charlie, _ = setup(tmp_path, via, with_secret_part=False)
    waiting = ask(charlie)
    approval = approve(alpha, waiting.request_id)
    shown: list[str] = []
    claim(charlie, confirm=lambda fp: shown.append(fp) or fp == approval.admin_fingerprint)
    assert shown == [approval.admin_fingerprint]
    assert_holds_k(charlie, alpha)


def test_member_path_without_a_way_to_confirm_claims_nothing(
    tmp_path: Path, lying: tuple[LyingRelay, Relay]
) -> None:
    liar, via = lying
    alpha, charlie, _ = setup(tmp_path, via, with_secret_part=False)
    waiting = ask(charlie)
    approval = approve(alpha, waiting.request_id)
    with pytest.raises(team.TeamError, match="--expect FINGERPRINT"):
        claim(charlie)
    assert not any(is_claim(m, p) for m, p, _, _ in liar.seen)  # the seal stays on the relay
    with charlie.open() as session:
        assert vault_keys.key_source(session.vault.conn, VAULT_ID) == "missing"
    assert claim(charlie, expect=approval.admin_fingerprint) == VAULT_ID  # and can be finished
    assert_holds_k(charlie, alpha)


@pytest.mark.parametrize("blobs", [True, False])
def test_member_path_relay_seals_its_own_k(
    tmp_path: Path, lying: tuple[LyingRelay, Relay], blobs: bool
) -> None:
    """The relay answers the claim with K' sealed to the requester's public key. The admin
    key's fingerprint differs from the admin's screen: refused (with and without blobs)."""
    liar, via = lying
    alpha, charlie, _ = setup(tmp_path, via, with_secret_part=False, blobs=blobs)
    attacker_seal = {}

    def forge(method: str, path: str, sent: Any, got: Any) -> Any:
        if not is_claim(method, path):
            return None
        made = seal_vault_key(liar.requester_public_key(), forged_k())
        attacker_seal.update(made.to_wire())
        return {**got, **made.to_wire()}

    liar.rewrite = forge
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
    assert_nothing_stored(charlie)


def test_member_path_prompt_refuses_a_relay_k(
    tmp_path: Path, lying: tuple[LyingRelay, Relay]
) -> None:
    """Same forgery on an empty vault, with the person answering the prompt honestly."""
    liar, via = lying
    alpha, charlie, _ = setup(tmp_path, via, with_secret_part=False, blobs=False)
    liar.rewrite = lambda m, p, s, got: (
        {**got, **seal_vault_key(liar.requester_public_key(), forged_k()).to_wire()}
        if is_claim(m, p)
        else None
    )
    waiting = ask(charlie)
    approval = approve(alpha, waiting.request_id)
    with pytest.raises(team.TeamError, match="was not confirmed"):
        claim(charlie, confirm=lambda fp: fp == approval.admin_fingerprint)
    assert_nothing_stored(charlie)


def test_member_path_blob_check_refuses_k_even_if_confirmed(
    tmp_path: Path, lying: tuple[LyingRelay, Relay]
) -> None:
    """Defence in depth (§14 step 4): the person wrongly confirms, the vault holds blobs,
    K' verifies none of them: refused loudly, nothing stored."""
    liar, via = lying
    alpha, charlie, _ = setup(tmp_path, via, with_secret_part=False)
    liar.rewrite = lambda m, p, s, got: (
        {**got, **seal_vault_key(liar.requester_public_key(), forged_k()).to_wire()}
        if is_claim(m, p)
        else None
    )
    waiting = ask(charlie)
    approve(alpha, waiting.request_id)
    with pytest.raises(team.TeamError, match="verifies none of the blobs"):
        claim(charlie, confirm=lambda fp: True)
    assert_nothing_stored(charlie)


def test_member_path_swapped_admin_key(tmp_path: Path, lying: tuple[LyingRelay, Relay]) -> None:
    liar, via = lying
    alpha, charlie, _ = setup(tmp_path, via, with_secret_part=False)
    other = new_handoff_keypair().public_key_b64url
    liar.rewrite = lambda m, p, s, got: {**got, "public_key": other} if is_claim(m, p) else None
    waiting = ask(charlie)
    approval = approve(alpha, waiting.request_id)
    with pytest.raises(team.TeamError, match="REFUSED"):
        claim(charlie, expect=approval.admin_fingerprint)
    assert_nothing_stored(charlie)


# --- pairing-code path (the secret part authenticates) -----------------------------------


def test_code_path_honest_relay(tmp_path: Path, lying: tuple[LyingRelay, Relay]) -> None:
    liar, via = lying
    alpha, charlie, code = setup(tmp_path, via)
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
    assert claim(charlie) == VAULT_ID  # no fingerprint to confirm
    assert_holds_k(charlie, alpha)
    # The relay saw the first part of the code only, never the secret part.
    everything = json.dumps(liar.seen)
    assert secret not in everything
    assert secret.replace("-", "") not in everything


def test_code_path_relay_seals_its_own_k(tmp_path: Path, lying: tuple[LyingRelay, Relay]) -> None:
    """K' sealed to the requester's key with a SPAKE2 message and auth made under a guessed
    secret part (the relay's one online guess), or with the authentication stripped."""
    liar, via = lying
    alpha, charlie, code = setup(tmp_path, via, blobs=False)  # no blob check to help
    guess = with_secret(parse_pairing_code(code).relay_code, "0000-0000")

    def forge(method: str, path: str, sent: Any, got: Any) -> Any:
        if not is_claim(method, path):
            return None
        [request_pake] = [
            s["pake"] for m, p, s, _ in liar.seen if m == "POST" and p.endswith("/handoff")
        ]
        made = seal_vault_key_with_code(
            pake_password(guess),
            got["request_id"],
            liar.requester_public_key(),
            decode_pake_message(request_pake, b"B"),
            forged_k(),
        )
        return {**got, **made.to_wire()}

    liar.rewrite = forge
    waiting = ask(charlie)
    approve(alpha, waiting.request_id)
    with pytest.raises(team.TeamError, match="not authenticated by this pairing code"):
        claim(charlie)
    assert_nothing_stored(charlie)


def test_code_path_relay_strips_the_authentication(
    tmp_path: Path, lying: tuple[LyingRelay, Relay]
) -> None:
    liar, via = lying
    alpha, charlie, _ = setup(tmp_path, via, blobs=False)

    def forge(method: str, path: str, sent: Any, got: Any) -> Any:
        if not is_claim(method, path):
            return None
        plain = seal_vault_key(liar.requester_public_key(), forged_k()).to_wire()
        return {"request_id": got["request_id"], "vault_id": got["vault_id"], **plain}

    liar.rewrite = forge
    waiting = ask(charlie)
    approve(alpha, waiting.request_id)
    with pytest.raises(team.TeamError, match="not authenticated by the pairing code"):
        claim(charlie)
    assert_nothing_stored(charlie)


def test_code_path_swapped_admin_key(tmp_path: Path, lying: tuple[LyingRelay, Relay]) -> None:
    liar, via = lying
    alpha, charlie, _ = setup(tmp_path, via)
    other = new_handoff_keypair().public_key_b64url
    liar.rewrite = lambda m, p, s, got: {**got, "public_key": other} if is_claim(m, p) else None
    waiting = ask(charlie)
    approve(alpha, waiting.request_id)
    with pytest.raises(team.TeamError, match="not authenticated by this pairing code"):
        claim(charlie)
    assert_nothing_stored(charlie)


def test_code_path_relay_replacing_the_requester_gets_nothing(
    tmp_path: Path, lying: tuple[LyingRelay, Relay]
) -> None:
    """The relay hands the admin its own public key and a SPAKE2 message under a guessed
    secret part: the seal the admin posts does not open for the relay, and the real
    requester refuses it."""
    liar, via = lying
    alpha, charlie, code = setup(tmp_path, via)
    attacker = new_handoff_keypair()
    guess = RequesterPake.start(
        pake_password(with_secret(parse_pairing_code(code).relay_code, "0000-0000"))
    )

    def swap(method: str, path: str, sent: Any, got: Any) -> Any:
        if method == "GET" and path.endswith("/handoff"):
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
        return None

    liar.rewrite = swap
    waiting = ask(charlie)
    approve(alpha, waiting.request_id)
    posted = liar.seal_posted()
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
    assert_nothing_stored(charlie)


def test_code_path_wrong_secret_part(tmp_path: Path, relay: Relay) -> None:
    alpha = make_device(tmp_path, relay, "alpha")
    with alpha.open() as session:
        code = parse_pairing_code(pairing.issue_code(session, "charlie").code)
    assert code.secret is not None
    wrong = "ZZZZ-ZZZZ" if code.secret != "ZZZZ-ZZZZ" else "YYYY-YYYY"
    charlie = new_device(tmp_path, relay, "charlie")
    with charlie.open() as session:
        pairing.link_with_code(session, relay.url, f"{code.relay_code}-{wrong}", "charlie")
    waiting = ask(charlie)
    approve(alpha, waiting.request_id)
    with pytest.raises(team.TeamError, match="mistyped secret part"):
        claim(charlie)
    assert_nothing_stored(charlie)
    # Without the code, the two compare fingerprints instead, and it works.
    waiting = ask(charlie)
    assert not waiting.by_code
    approval = approve(alpha, waiting.request_id)
    claim(charlie, expect=approval.admin_fingerprint)
    assert_holds_k(charlie, alpha)


def test_admin_without_the_code_refuses_to_seal(tmp_path: Path, relay: Relay) -> None:
    """A request naming a code this admin device did not issue (or already used)."""
    alpha, charlie, _ = setup(tmp_path, relay)
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
    assert_holds_k(charlie, alpha)
