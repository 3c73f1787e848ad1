"""The account, pairing and handoff commands as a person runs them (`engram-sync` processes
against an `engram-relay serve` process), then zero knowledge: neither the relay's database
(every column of every table, as text) nor the relay's own output (debug logs) holds a
passphrase, the account password, A, K, a memory or the recovery phrase.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from engram_sync.shared_format.b64 import b64decode_std, b64encode_std
from engram_sync.shared_format.login import login_secret
from engram_sync.shared_format.sync_keys import derive_sync_keys
from engram_sync.shared_format.wraps import pack_vault_key, unwrap_with_secret
from tests.relay.accounts.test_zero_knowledge import dump_every_column, spellings
from tests.relay.conftest import ADMIN_KEY, Relay, base_config, free_port

BIN = Path(sys.executable).parent
PASSPHRASE_A = "alpha local and team passphrase 4d2c"
PASSPHRASE_B = "bravo's own local passphrase 81fe"
PASSPHRASE_C = "charlie's own local passphrase 0b7a"
PASSWORD = "account password canary 5e9d"
EMAIL = "carol@example.org"
MEMORY = "memory canary: the vault under the stairs is 3141"
VAULT_ID = "team-cli"
FINGERPRINT = re.compile(r"\b[A-Z2-7]{4}-[A-Z2-7]{4}-[A-Z2-7]{4}-[A-Z2-7]{4}\b")
WHOLE_CODE = re.compile(r"ENG(?:-[0-9A-Z]{4}){5}")  # PROTOCOL §14 step 4: with the secret part


@dataclass
class ServedRelay:
    """An `engram-relay serve` process; `output()` is everything it printed."""

    relay: Relay
    log: Path

    def output(self) -> str:
        return self.log.read_text(encoding="utf-8", errors="replace")


@pytest.fixture
def relay_process(tmp_path: Path, fresh_database_url: str) -> Iterator[ServedRelay]:
    with serve_relay(tmp_path, fresh_database_url) as served:
        yield served


@contextmanager
def serve_relay(tmp_path: Path, fresh_database_url: str) -> Iterator[ServedRelay]:
    """An `engram-relay serve` process on a free port, stopped on exit."""
    port = free_port()
    log = tmp_path / "relay.log"
    env = dict(os.environ, SYNC_API_KEYS=f"{ADMIN_KEY}:100000")
    cmd = [
        str(BIN / "engram-relay"), "serve", "--database-url", fresh_database_url,
        "--port", str(port), "--data-dir", str(tmp_path / "relay-data"),
        "--log-level", "debug", "--log-format", "text",
    ]  # fmt: skip
    with log.open("wb") as sink:
        process = subprocess.Popen(cmd, stdout=sink, stderr=subprocess.STDOUT, env=env)
    url = f"http://127.0.0.1:{port}"
    try:
        deadline = time.monotonic() + 60
        while True:
            try:
                if httpx.get(f"{url}/ready", timeout=1).status_code == 200:
                    break
            except httpx.TransportError:
                pass
            assert process.poll() is None, log.read_text()
            assert time.monotonic() < deadline, "relay did not start"
            time.sleep(0.1)
        yield ServedRelay(Relay(url, fresh_database_url, base_config(fresh_database_url)), log)
    finally:
        process.send_signal(signal.SIGTERM)
        process.wait(timeout=30)


class Device:
    """One vault directory driven through `engram-sync` processes."""

    def __init__(self, path: Path, passphrase: str) -> None:
        self.path = path
        self.env = {
            **os.environ,
            "ENGRAM_PASSPHRASE": passphrase,
            "ENGRAM_ACCOUNT_PASSWORD": PASSWORD,
            "ENGRAM_EMAIL": EMAIL,
            "HOME": str(path.parent),
            "PYTHONUNBUFFERED": "1",
        }

    def args(self, *args: str) -> list[str]:
        return [str(BIN / "engram-sync"), "--vault", str(self.path), *args]

    def run(self, *args: str, ok: bool = True, **env: str) -> subprocess.CompletedProcess[str]:
        result = subprocess.run(
            self.args(*args),
            env={**self.env, **env},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
            stdin=subprocess.DEVNULL,
        )
        if ok:
            assert result.returncode == 0, result.stdout + result.stderr
        return result


def one_line_error(result: subprocess.CompletedProcess[str], text: str) -> None:
    assert result.returncode == 1, result.stdout + result.stderr
    assert result.stderr.strip() == f"error: {text}", result.stderr
    assert "Traceback" not in result.stderr


def test_cli_account_and_handoff_leave_no_secret_on_the_relay(
    tmp_path: Path, relay_process: ServedRelay
) -> None:
    url = relay_process.relay.url
    a = Device(tmp_path / "a", PASSPHRASE_A)
    a.run("init")
    a.run("link", "--relay", url, "--api-key", ADMIN_KEY, "--vault-id", VAULT_ID, "--label", "a")
    memory_id = a.run("add", MEMORY).stdout.strip()
    a.run("sync")
    a.run("account", "signup", "--relay", url)
    a.run("vault", "open")
    shown = a.run("account", "recovery-phrase").stdout
    [phrase] = re.findall(r"^ +((?:[a-z]+ ){11}[a-z]+)$", shown, flags=re.M)
    status = json.loads(a.run("account", "status", "--json").stdout)
    assert status["vaults"] == [VAULT_ID]
    assert status["session_valid"] is True
    assert "session_token" not in status

    # Device B: its own local passphrase; the vault key comes from the account.
    b = Device(tmp_path / "b", PASSPHRASE_B)
    b.run("init")
    b.run("account", "signin", "--relay", url)
    config_before = (b.path / "config.json").read_bytes()
    one_line_error(
        b.run("link", "--relay", url, "--account", ok=False, ENGRAM_ACCOUNT_PASSWORD="wrong!"),
        "wrong account password",
    )
    assert (b.path / "config.json").read_bytes() == config_before
    assert "linked to" in b.run("link", "--relay", url, "--account", "--label", "b").stdout
    b.run("sync")
    listed = json.loads(b.run("list", "--json").stdout)
    assert [(m["id"], m["content"]) for m in listed] == [(memory_id, MEMORY)]
    config = json.loads((b.path / "config.json").read_text())
    assert oct((b.path / "config.json").stat().st_mode & 0o777) == "0o600"
    session_token = config["account"]["session_token"]

    # Device C: a pairing code from A, then the key handoff A approves; the whole code
    # authenticates it (PROTOCOL §14 step 4), so neither side compares fingerprints.
    invite = a.run("team", "invite", "--label", "c").stdout
    [code] = WHOLE_CODE.findall(invite)
    c = Device(tmp_path / "c", PASSPHRASE_C)
    c.run("init")
    linked = c.run("link", "--relay", url, "--code", code, "--label", "c").stdout
    assert "engram-sync team request" in linked
    requester = subprocess.Popen(
        c.args("team", "request", "--wait", "60"),
        env=c.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        assert requester.stdout is not None
        seen = ""
        while not FINGERPRINT.search(seen):
            line = requester.stdout.readline()
            assert line, seen + (requester.stderr.read() if requester.stderr else "")
            seen += line
        fingerprint = FINGERPRINT.search(seen).group(0)  # type: ignore[union-attr]
        assert "pairing code authenticates this request" in seen
        [pending] = json.loads(a.run("team", "pending", "--json").stdout)
        assert pending["fingerprint"] == fingerprint
        assert pending["pairing_code"] is True
        approve = a.run("team", "approve", pending["request_id"])  # no question to answer
        assert "the code authenticates it" in approve.stdout
        rest, errors = requester.communicate(timeout=60)
        assert requester.returncode == 0, seen + rest + errors
    finally:
        if requester.poll() is None:
            requester.kill()
            requester.wait()
    assert "now holds the key" in rest
    c.run("sync")
    assert MEMORY in c.run("show", memory_id).stdout

    # Zero knowledge: the relay's database and its own output.
    dump = dump_every_column(relay_process.relay)
    output = relay_process.output()
    [wraps] = relay_process.relay.sql("SELECT wrapped_a, salt_pw, wrapped_a_rec FROM account_wraps")
    account_key = unwrap_with_secret(
        b64decode_std(wraps["wrapped_a"]), b64decode_std(wraps["salt_pw"]), PASSWORD
    )
    keys = derive_sync_keys(PASSPHRASE_A)
    k = pack_vault_key(keys.enc_key, keys.hmac_key, VAULT_ID)
    # Positive controls: these are the right places to look.
    assert wraps["wrapped_a"] in dump
    assert wraps["wrapped_a_rec"] in dump
    assert VAULT_ID in dump
    assert memory_id in dump
    assert "/account/wraps/password" in output  # the debug log records requests
    secrets = [
        PASSPHRASE_A,
        PASSPHRASE_B,
        PASSPHRASE_C,
        PASSWORD,
        login_secret(PASSWORD, EMAIL),  # what the relay was sent: only a hash of it is kept
        MEMORY,
        "vault under the stairs",
        phrase,
        " ".join(phrase.split()[:3]),
        session_token,
        code,
        code[-9:],  # the secret part alone
        code[-9:].replace("-", ""),
        b64encode_std(account_key),
    ]
    secrets += spellings(account_key) + spellings(k) + spellings(keys.enc_key)
    secrets += spellings(keys.hmac_key)
    for where, text in (("database", dump), ("relay output", output)):
        found = [s for s in secrets if s in text or s.lower() in text.lower()]
        assert found == [], f"{where} holds {found}"


def test_cli_member_request_confirms_the_admin_fingerprint(
    tmp_path: Path, relay_process: ServedRelay
) -> None:
    """A code without its secret part (PROTOCOL §14 step 4, member-request path): the admin
    compares the requester's fingerprint, the new device stores K only once the admin
    key's fingerprint is confirmed (`--expect` in a script; without it, nothing is claimed)."""
    url = relay_process.relay.url
    a = Device(tmp_path / "a", PASSPHRASE_A)
    a.run("init")
    a.run("link", "--relay", url, "--api-key", ADMIN_KEY, "--vault-id", VAULT_ID, "--label", "a")
    memory_id = a.run("add", MEMORY).stdout.strip()
    a.run("sync")
    [whole] = WHOLE_CODE.findall(a.run("team", "invite").stdout)
    relay_part = whole[: len("ENG-XXXX-XXXX-XXXX")]

    c = Device(tmp_path / "c", PASSPHRASE_C)
    c.run("init")
    c.run("link", "--relay", url, "--code", relay_part, "--label", "c")
    asked = c.run("team", "request", "--wait", "0", ok=False)
    assert asked.returncode == 1
    assert "keep waiting" in asked.stderr
    [requester_fp] = FINGERPRINT.findall(asked.stdout)
    assert "Compare this code" in asked.stdout

    [pending] = json.loads(a.run("team", "pending", "--json").stdout)
    assert (pending["fingerprint"], pending["pairing_code"]) == (requester_fp, False)
    approve = subprocess.run(
        a.args("team", "approve", pending["request_id"]),
        env=a.env,
        input="y\n",
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert approve.returncode == 0, approve.stdout + approve.stderr
    shown = FINGERPRINT.findall(approve.stdout)
    assert shown[0] == requester_fp
    [admin_fp] = set(shown[1:])
    assert admin_fp != requester_fp

    # No terminal, no --expect: refused, nothing claimed or stored, and it says what to do.
    refused = c.run("team", "request", ok=False)
    assert refused.returncode == 1, refused.stdout + refused.stderr
    assert "--expect FINGERPRINT" in refused.stderr
    assert "nothing was claimed or stored" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert json.loads(c.run("status", "--json").stdout)["vault_key"] == "missing"

    done = c.run("team", "request", "--expect", admin_fp.lower())
    assert "now holds the key" in done.stdout
    c.run("sync")
    assert MEMORY in c.run("show", memory_id).stdout
