"""Zero knowledge (issue 8 §6): after a full run — two devices syncing canary memories with
edits, deletions and a conflict, an account with its recovery phrase, a device linked
through the account, a device paired by code and given K by the team handoff — the relay's
database (every column of every table), its debug-level logs and its metrics contain no
canary plaintext, passphrase, password, login secret, derived key, A, K, recovery phrase,
session token or full API key. Positive controls show the dump and logs are real."""

from __future__ import annotations

import base64
import secrets
import threading
from pathlib import Path
from typing import Any

import asyncpg
import pytest

from engram_sync.client._accounts import account, pairing, team
from engram_sync.client._session import VaultSession
from engram_sync.client._vault import store as local_store
from engram_sync.client._vault.vault_key_store import pack_keys
from engram_sync.shared_format.login import login_secret
from engram_sync.shared_format.plaintext import encode_memory
from tests.e2e.conftest import DeviceHandle, make_device
from tests.e2e.helpers import add, delete, edit
from tests.relay.conftest import METRICS_TOKEN, Relay, RelayThread, base_config
from tests.reliability.support import RelayProcess, database_text

#: The same tests on the Citus cluster too, by default (issue 18, tests/conftest.py).
pytestmark = pytest.mark.both_databases

PASSWORD = "zk account password " + secrets.token_hex(4)
EMAIL = "zk@example.org"


def _forms(secret: bytes) -> list[str]:
    """Every text spelling of a binary secret the relay could leak it in."""
    return [
        secret.hex(),
        base64.b64encode(secret).decode(),
        base64.urlsafe_b64encode(secret).decode().rstrip("="),
    ]


def test_nothing_secret_reaches_the_relay(fresh_database_url: str, tmp_path: Path) -> None:

    log_path = tmp_path / "relay.log"
    relay_process = RelayProcess(fresh_database_url, log_path=log_path, log_level="debug")
    relay_process.start()
    relay = Relay(relay_process.url, fresh_database_url, None)  # type: ignore[arg-type]
    try:
        canaries = [f"canary-{secrets.token_hex(8)}" for _ in range(4)]
        alpha = make_device(tmp_path, relay, "alpha")
        bravo = make_device(tmp_path, relay, "bravo")
        ids = [add(alpha, f"memory holding {c}") for c in canaries[:3]]
        alpha.sync()
        bravo.sync()
        edit(alpha, ids[0], f"edited, still secret: {canaries[3]}")
        edit(bravo, ids[0], "bravo's concurrent edit")  # a conflict on bravo
        delete(alpha, ids[1])
        alpha.sync()
        bravo.sync()

        with alpha.open() as session:
            account.signup(session.path, relay.url, EMAIL, PASSWORD)
            phrase = account.set_recovery_phrase(session.path, PASSWORD)
            account.open_vault(session, PASSWORD)
            keys = session.keys
            k = pack_keys(keys, "team-e2e")
            account_key = account.unlock(session.path, PASSWORD).account_key
            session_token = account.require_account(session.path).session_token
            code = pairing.issue_code(session, "delta").code
            api_keys = {session.config.api_key}

        charlie_pass = "charlie's own local passphrase"
        VaultSession.open(tmp_path / "charlie", charlie_pass, create=True).close()
        with VaultSession.open(tmp_path / "charlie", charlie_pass) as session:
            account.signin(session.path, relay.url, EMAIL, PASSWORD)
            account.link_with_account(session, relay.url, PASSWORD, label="charlie")
            api_keys.add(session.config.api_key)
            with session.relay() as client:
                session.syncer(client).sync()

        delta_pass = "delta's own local passphrase"
        VaultSession.open(tmp_path / "delta", delta_pass, create=True).close()
        delta = DeviceHandle("delta", tmp_path / "delta", relay, passphrase=delta_pass)
        with delta.open() as session:
            pairing.link_with_code(session, relay.url, code, "delta")
            api_keys.add(session.config.api_key)
        delta.restart()
        shown: list[team.Waiting] = []
        outcome: dict[str, Any] = {}
        ready = threading.Event()

        def requester() -> None:
            try:
                with VaultSession.open(delta.path, delta_pass) as session:
                    outcome["vault"] = team.request_key(
                        session,
                        wait=60,
                        poll=0.1,
                        on_waiting=lambda w: (shown.append(w), ready.set()),
                    )
            except BaseException as exc:
                outcome["error"] = exc

        thread = threading.Thread(target=requester)
        thread.start()
        assert ready.wait(30)
        with alpha.open() as session:
            team.approve(session, team.find_pending(session, shown[0].request_id))
        thread.join(60)
        assert outcome == {"vault": "team-e2e"}
        delta.sync()

        metrics = relay.scrape()
    finally:
        relay_process.stop()

    dump = database_text(fresh_database_url)
    logs = log_path.read_text(encoding="utf-8", errors="replace")
    haystacks = {"database": dump, "logs": logs, "metrics": metrics}

    forbidden: dict[str, list[str]] = {
        "canary plaintext": [*canaries, "bravo's concurrent edit"],
        "vault passphrase": [alpha.passphrase, charlie_pass, delta_pass],
        "account password": [PASSWORD],
        "login secret": [login_secret(PASSWORD, EMAIL)],
        "enc_key": _forms(keys.enc_key),
        "hmac_key": _forms(keys.hmac_key),
        "account key A": _forms(account_key),
        "vault key K": _forms(k),
        "recovery phrase": [phrase, " ".join(phrase.split()[:3])],
        "session token": [session_token],
        "API keys": sorted(key for key in api_keys if key),
        "pairing code": [code, code.replace("-", "")],
        "metrics token": [METRICS_TOKEN],
    }
    leaks = [
        f"{what} in {where}"
        for what, needles in forbidden.items()
        for needle in needles
        for where, text in haystacks.items()
        if needle and needle in text
    ]
    assert leaks == []

    # positive controls: the dump holds the ciphertext and wraps, the logs hold requests
    assert '"ciphertext"' in dump
    assert '"wrapped_a"' in dump
    assert '"wrapped_k"' in dump
    assert "/v1/vaults/{vault_id}/push" in logs
    assert '"request_id"' in logs
    assert all(key[:8] in logs for key in api_keys if key)  # prefixes are fine, and present
    assert "engram_relay_blobs_accepted_total" in metrics


# --- PROTOCOL §16: the relay learns a memory's size bucket, not its size --------------------


def _plaintext_bytes(device: DeviceHandle, memory_id: str) -> tuple[int, int]:
    """(unpadded §4 plaintext bytes, content bytes) of a local memory."""
    with device.open() as session:
        memory = local_store.get_memory(session.vault.conn, memory_id)
        assert memory is not None
    return len(encode_memory(memory).encode("utf-8")), len(memory.content.encode("utf-8"))


def _memory_of_size(device: DeviceHandle, size: int) -> str:
    """A memory whose unpadded §4 plaintext is exactly `size` bytes."""
    memory_id = add(device, "x")
    for _ in range(3):  # a timestamp without microseconds is shorter: measure, then adjust
        total, content = _plaintext_bytes(device, memory_id)
        edit(device, memory_id, "x" * (size - (total - content)))
        if _plaintext_bytes(device, memory_id)[0] == size:
            return memory_id
    raise AssertionError(f"could not make a memory of {size} plaintext bytes")


async def _ciphertext_chars(database_url: str) -> dict[str, int]:
    conn = await asyncpg.connect(database_url)
    try:
        rows = await conn.fetch("SELECT memory_id, length(ciphertext) AS n FROM blobs")
        return {r["memory_id"]: r["n"] for r in rows}
    finally:
        await conn.close()


def test_sizes_inside_one_padme_bucket_give_equal_ciphertexts(
    fresh_database_url: str, tmp_path: Path
) -> None:
    import asyncio

    # By hand from PROTOCOL §16: 1024 <= L < 2048 has E = 10, S = 4, a step of 64, so
    # 1090 and 1150 both pad to 1152 bytes and 1160 pads to 1216.
    server = RelayThread(base_config(fresh_database_url)).start()
    try:
        relay = Relay(server.url, fresh_database_url, None)  # type: ignore[arg-type]
        alpha = make_device(tmp_path, relay, "alpha")
        small, large, next_bucket = (_memory_of_size(alpha, n) for n in (1090, 1150, 1160))
        alpha.sync()
        alpha.restart()
    finally:
        server.stop()
    chars = asyncio.run(_ciphertext_chars(fresh_database_url))
    assert chars[small] == chars[large] == 4 * ((12 + 1152 + 16 + 2) // 3)
    # the positive case next to it: the next bucket is visibly longer
    assert chars[next_bucket] == 4 * ((12 + 1216 + 16 + 2) // 3)
