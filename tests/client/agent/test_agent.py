"""The per-user key agent (issue 17, "unlock once"; docs/agent.md): `engram-sync unlock`,
`lock`, and every command taking the keys from the agent, through the real executable with
real SQCipher vaults, a real relay and the real agent process (client._agent)."""

from __future__ import annotations

import json
import os
import signal
import socket
import stat
import struct
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from engram_sync.client._agent import control
from engram_sync.client._agent.messages import (
    Get,
    HeldKeys,
    ProtocolError,
    Put,
    Status,
    Stop,
    read_request,
    send,
)
from engram_sync.client._agent.paths import SOCKET_NAME, agent_dir
from engram_sync.client._agent.peer import peer_allowed, peer_uid
from engram_sync.client._agent.server import LOCKED, REFUSED, Agent
from engram_sync.shared_format.sync_keys import derive_sync_keys
from engram_sync.shared_format.vault import passphrase_vault_key, vault_salt16
from tests.relay.conftest import ADMIN_KEY, Relay

EXE = str(Path(sys.executable).parent / "engram-sync")
PASSPHRASE = "unlock once correct horse battery staple"
NO_PASSPHRASE = "no passphrase: set ENGRAM_PASSPHRASE"
WAIT_S = 60.0  # a generous bound for a process to end on 2 shared cores (not a timing)


class Env:
    """The user's environment for the CLI: home, config and runtime directories."""

    def __init__(self, root: Path, runtime: Path) -> None:
        self.root = root
        self.home = root / "home"
        self.runtime = runtime
        self.home.mkdir()

    def cli(
        self, *args: str, passphrase: str | None = None, vault: Path | None = None
    ) -> subprocess.CompletedProcess[str]:
        env = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
        env.update(HOME=str(self.home), XDG_CONFIG_HOME=str(self.home / "config"),
                   XDG_RUNTIME_DIR=str(self.runtime))  # fmt: skip
        if passphrase is not None:
            env["ENGRAM_PASSPHRASE"] = passphrase
        vault_args = ["--vault", str(vault)] if vault is not None else []
        return subprocess.run(
            [EXE, *vault_args, *args],
            env=env,
            cwd=self.root,
            stdin=subprocess.DEVNULL,  # not a terminal: a command that needs a prompt fails
            capture_output=True,
            text=True,
            timeout=180,
            check=False,
        )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def agent_pid() -> int | None:
    reply = control.status()
    return None if reply is None else reply.pid


def wait_gone(pid: int) -> bool:
    deadline = time.monotonic() + WAIT_S
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return True
        time.sleep(0.05)
    return False


def _stop_agent() -> None:
    pid = agent_pid()
    control.stop()
    if pid is not None and not wait_gone(pid):
        os.kill(pid, signal.SIGKILL)


@pytest.fixture
def user(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[Env]:
    """A user with their own runtime directory; this test process asks the same agent."""
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    env = Env(tmp_path, runtime)
    try:
        yield env
    finally:
        _stop_agent()


def new_vault(user: Env, name: str = "vault", passphrase: str = PASSPHRASE) -> Path:
    vault = user.root / name
    ok(user.cli("init", passphrase=passphrase, vault=vault))
    return vault


# --- through the real CLI -------------------------------------------------------------------


def test_unlock_once_then_commands_and_sync_need_no_passphrase_until_lock(
    user: Env, relay: Relay
) -> None:
    vault = new_vault(user)
    first = ok(user.cli("add", "before unlock", passphrase=PASSPHRASE, vault=vault)).strip()
    # without the agent a command needs the passphrase
    assert NO_PASSPHRASE in user.cli("list", vault=vault).stderr

    assert "unlocked" in ok(user.cli("unlock", passphrase=PASSPHRASE, vault=vault))
    second = ok(user.cli("add", "after unlock", vault=vault)).strip()
    listed = json.loads(ok(user.cli("list", "--json", vault=vault)))
    assert [m["id"] for m in listed] == [first, second]
    assert json.loads(ok(user.cli("status", "--json", vault=vault)))["agent"] == "unlocked"

    # sync with the agent's sync keys; another device with the passphrase reads both
    ok(user.cli("link", "--relay", relay.url, "--api-key", ADMIN_KEY, "--vault-id", "agent-v",
                vault=vault))  # fmt: skip
    assert "pushed 2" in ok(user.cli("sync", vault=vault))
    other = new_vault(user, "other")
    ok(user.cli("link", "--relay", relay.url, "--api-key", ADMIN_KEY, "--vault-id", "agent-v",
                passphrase=PASSPHRASE, vault=other))  # fmt: skip
    ok(user.cli("sync", passphrase=PASSPHRASE, vault=other))
    pulled = json.loads(ok(user.cli("list", "--json", passphrase=PASSPHRASE, vault=other)))
    assert sorted(m["content"] for m in pulled) == ["after unlock", "before unlock"]
    # the other vault is not unlocked: the agent holds vaults one by one
    assert NO_PASSPHRASE in user.cli("list", vault=other).stderr
    assert (
        json.loads(ok(user.cli("status", "--json", passphrase=PASSPHRASE, vault=other)))["agent"]
        == "locked"
    )

    pid = agent_pid()
    assert pid is not None
    assert "locked" in ok(user.cli("lock"))
    assert wait_gone(pid)
    assert NO_PASSPHRASE in user.cli("list", vault=vault).stderr
    status = json.loads(ok(user.cli("status", "--json", passphrase=PASSPHRASE, vault=vault)))
    assert status["agent"] == "not running"
    assert "no key agent is running" in ok(user.cli("lock"))


def test_lock_vault_forgets_only_that_vault(user: Env) -> None:
    work, notes = new_vault(user, "work"), new_vault(user, "notes")
    ok(user.cli("unlock", passphrase=PASSPHRASE, vault=work))
    ok(user.cli("unlock", passphrase=PASSPHRASE, vault=notes))
    ok(user.cli("list", vault=work))
    ok(user.cli("list", vault=notes))
    assert "locked" in ok(user.cli("lock", "--vault", str(work)))
    assert NO_PASSPHRASE in user.cli("list", vault=work).stderr
    ok(user.cli("list", vault=notes))
    assert "does not hold" in ok(user.cli("lock", "--vault", str(work)))


def test_wrong_passphrase_is_refused_before_the_agent_keeps_anything(user: Env) -> None:
    vault = new_vault(user)
    refused = user.cli("unlock", passphrase="not the passphrase", vault=vault)
    assert refused.returncode == 2
    assert "wrong passphrase" in refused.stderr
    assert control.status() is None  # no agent was even started
    assert NO_PASSPHRASE in user.cli("list", vault=vault).stderr
    # the positive case: the right one unlocks
    ok(user.cli("unlock", passphrase=PASSPHRASE, vault=vault))
    ok(user.cli("list", vault=vault))
    # and a wrong one later does not replace what the agent holds
    assert user.cli("unlock", passphrase="not the passphrase", vault=vault).returncode == 2
    ok(user.cli("list", vault=vault))


def test_socket_is_0600_in_a_0700_directory_and_the_agent_has_no_passphrase(user: Env) -> None:
    vault = new_vault(user)
    ok(user.cli("unlock", passphrase=PASSPHRASE, vault=vault))
    directory = user.runtime / "engram-sync"
    assert agent_dir() == directory
    sock = directory / SOCKET_NAME
    assert stat.S_ISSOCK(sock.stat().st_mode)
    assert stat.S_IMODE(sock.stat().st_mode) == 0o600
    assert stat.S_IMODE(directory.stat().st_mode) == 0o700
    pid = agent_pid()
    assert pid is not None
    environ = Path(f"/proc/{pid}/environ").read_bytes()
    assert b"XDG_RUNTIME_DIR=" in environ  # the positive case: its environment is readable
    assert PASSPHRASE.encode() not in environ
    assert b"ENGRAM_PASSPHRASE" not in environ


def test_an_unsafe_agent_directory_is_refused(user: Env) -> None:
    vault = new_vault(user)
    target = user.root / "elsewhere"
    target.mkdir(mode=0o700)
    (user.runtime / "engram-sync").symlink_to(target)
    refused = user.cli("unlock", passphrase=PASSPHRASE, vault=vault)
    assert refused.returncode == 1
    assert "is not a directory (a link or a file): refusing to use it" in refused.stderr
    assert not any(target.iterdir())


def test_a_socket_path_too_long_to_bind_says_so_in_one_line(user: Env) -> None:
    # the kernel binds a Unix socket path of at most 107 bytes: past it the agent died
    # before saying why and unlock said only "no answer"
    vault = new_vault(user)
    deep = user.runtime / ("d" * 60) / ("e" * 60)
    deep.mkdir(parents=True, mode=0o700)
    (user.root / "deep").mkdir()
    deep_user = Env(user.root / "deep", deep)
    refused = deep_user.cli("unlock", passphrase=PASSPHRASE, vault=vault)
    assert refused.returncode == 1
    (line,) = refused.stderr.splitlines()  # one line, no traceback
    assert "socket path" in line
    assert "longer than the 107 a Unix socket takes" in line
    assert "set XDG_RUNTIME_DIR to a shorter directory" in line
    assert not (deep / "engram-sync").exists()  # nothing made there
    assert agent_pid() is None
    # the honest case: a short runtime directory works
    ok(user.cli("unlock", passphrase=PASSPHRASE, vault=vault))


@pytest.mark.skipif(os.getuid() != 0, reason="making a directory another uid owns needs root")
def test_a_squatted_agent_directory_says_whose_it_is_and_what_to_do(user: Env) -> None:
    # issue 31: another user made the agent's directory first (a shared runtime directory)
    vault = new_vault(user)
    squatted = user.runtime / "engram-sync"
    squatted.mkdir(mode=0o777)
    os.chown(squatted, 65534, 65534)
    refused = user.cli("unlock", passphrase=PASSPHRASE, vault=vault)
    assert refused.returncode == 1
    (line,) = refused.stderr.splitlines()  # one line, no traceback
    assert f"{squatted} belongs to another user (uid 65534): refusing to use it" in line
    assert "set XDG_RUNTIME_DIR to a directory of your own" in line
    assert not any(squatted.iterdir())  # no socket or lock made in it
    assert agent_pid() is None
    # the honest case: once it is gone, unlock makes its own and works
    squatted.rmdir()
    ok(user.cli("unlock", passphrase=PASSPHRASE, vault=vault))
    assert squatted.stat().st_uid == os.getuid()


def test_idle_timeout_ends_the_agent(user: Env) -> None:
    vault = new_vault(user)
    ok(user.cli("unlock", "--timeout", "1", passphrase=PASSPHRASE, vault=vault))
    pid = agent_pid()
    assert pid is not None
    assert wait_gone(pid)
    assert not (user.runtime / "engram-sync" / SOCKET_NAME).exists()
    assert NO_PASSPHRASE in user.cli("list", vault=vault).stderr


def test_agent_killed_leaves_commands_on_the_passphrase(user: Env) -> None:
    vault = new_vault(user)
    ok(user.cli("add", "kept", passphrase=PASSPHRASE, vault=vault))
    ok(user.cli("unlock", passphrase=PASSPHRASE, vault=vault))
    pid = agent_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert wait_gone(pid)
    assert (user.runtime / "engram-sync" / SOCKET_NAME).exists()  # a dead agent's socket
    assert "kept" in ok(user.cli("list", passphrase=PASSPHRASE, vault=vault))
    assert NO_PASSPHRASE in user.cli("list", vault=vault).stderr
    # a new unlock replaces the dead socket
    ok(user.cli("unlock", passphrase=PASSPHRASE, vault=vault))
    assert "kept" in ok(user.cli("list", vault=vault))


def test_stale_keys_fall_back_to_the_passphrase_and_are_forgotten(user: Env) -> None:
    vault = new_vault(user)
    ok(user.cli("unlock", passphrase=PASSPHRASE, vault=vault))
    # the agent holds a key that no longer opens the vault (its passphrase changed)
    assert control.put(vault, HeldKeys(db_key="0" * 64), 60)
    assert "no memories" in user.cli("list", passphrase=PASSPHRASE, vault=vault).stderr
    assert control.held_keys(vault) is None  # forgotten
    assert NO_PASSPHRASE in user.cli("list", vault=vault).stderr


def _files_holding(root: Path, needles: list[bytes]) -> list[Path]:
    found = []
    for path in root.rglob("*"):
        if path.is_file() and not path.is_symlink():
            data = path.read_bytes()
            if any(needle in data for needle in needles):
                found.append(path)
    return found


def test_keys_never_reach_a_file(user: Env, relay: Relay) -> None:
    vault = new_vault(user)
    ok(user.cli("unlock", passphrase=PASSPHRASE, vault=vault))
    ok(user.cli("add", "a memory", vault=vault))
    ok(user.cli("link", "--relay", relay.url, "--api-key", ADMIN_KEY, "--vault-id", "scan-v",
                vault=vault))  # fmt: skip
    ok(user.cli("sync", vault=vault))
    ok(user.cli("status", vault=vault))
    db_key = passphrase_vault_key(PASSPHRASE, vault_salt16(vault))
    sync = derive_sync_keys(PASSPHRASE)
    held = control.held_keys(vault)
    assert held == HeldKeys(db_key=db_key, enc_key=sync.enc_key.hex(), hmac_key=sync.hmac_key.hex())
    needles = [db_key.encode(), sync.enc_key.hex().encode(), sync.hmac_key.hex().encode(),
               sync.enc_key, sync.hmac_key, bytes.fromhex(db_key)]  # fmt: skip
    ok(user.cli("lock"))
    assert _files_holding(user.root, needles) == []  # home, config, runtime dir, vaults
    # the scan's positive case: a key written to a file is found
    leak = user.home / "leak.txt"
    leak.write_text(f"key={sync.enc_key.hex()}\n", encoding="utf-8")
    assert _files_holding(user.root, needles) == [leak]


# --- the peer's uid -------------------------------------------------------------------------


def test_peer_uid_on_a_socketpair() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        assert peer_uid(left) == os.getuid()
        assert peer_allowed(left)
        assert not peer_allowed(left, uid=os.getuid() + 1)


_AS_NOBODY = """
import json, os, socket, struct, sys
os.setgid(65534)
os.setuid(65534)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.settimeout(10)
sock.connect(sys.argv[1])
body = json.dumps({"type": "get", "vault": sys.argv[2]}).encode()
try:
    sock.sendall(struct.pack(">I", len(body)) + body)
except BrokenPipeError:
    pass  # the agent refused at once and hung up; its reply is still there to read
head = b""
while len(head) < 4:
    head += sock.recv(4 - len(head))
(n,) = struct.unpack(">I", head)
reply = b""
while len(reply) < n:
    reply += sock.recv(n - len(reply))
print(reply.decode())
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a client as nobody")
def test_another_uid_is_refused(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # a runtime directory nobody can reach: tmp_path is 0700, and so is the agent's directory
    runtime = Path(tempfile.mkdtemp(prefix="engram-agent-uid-", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    env = Env(tmp_path, runtime)
    try:
        vault = new_vault(env)
        ok(env.cli("unlock", passphrase=PASSPHRASE, vault=vault))
        sock = agent_dir() / SOCKET_NAME
        # only the agent's own check stands in the way: open the path up for this test
        os.chmod(runtime, 0o711)
        os.chmod(agent_dir(), 0o711)
        os.chmod(sock, 0o666)
        name = control.vault_name(vault)
        result = subprocess.run(
            [sys.executable, "-c", _AS_NOBODY, str(sock), name],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert result.returncode == 0, result.stderr
        reply = json.loads(result.stdout)
        assert reply["ok"] is False
        assert reply["error"] == REFUSED
        assert "keys" not in reply or reply["keys"] is None
        # the positive case: this uid gets the keys over the same socket
        held = control.held_keys(vault)
        assert held is not None
        assert held.db_key == passphrase_vault_key(PASSPHRASE, vault_salt16(vault))
    finally:
        _stop_agent()
        for path in sorted(runtime.rglob("*"), reverse=True):
            path.unlink() if not path.is_dir() else path.rmdir()
        runtime.rmdir()


# --- the agent's answers and the protocol ---------------------------------------------------


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_agent_answers_and_idle_clock() -> None:
    clock = FakeClock()
    agent = Agent(10.0, clock)
    keys = HeldKeys(db_key="a" * 64, enc_key="b" * 64, hmac_key="c" * 64)
    assert agent.answer(Get(vault="/v"))[0].error == LOCKED
    clock.now += 9
    assert agent.idle_left() == pytest.approx(1.0)  # a locked answer does not keep it alive
    reply, stop = agent.answer(Put(vault="/v", keys=keys, idle_timeout_s=20.0))
    assert (reply.ok, reply.vaults, stop) == (True, ["/v"], False)
    assert agent.idle_left() == pytest.approx(20.0)
    clock.now += 15
    assert agent.answer(Get(vault="/v"))[0].keys == keys
    assert agent.idle_left() == pytest.approx(20.0)  # a use keeps it alive
    status = agent.answer(Status())[0]
    assert (status.vaults, status.idle_timeout_s, status.pid) == (["/v"], 20.0, os.getpid())
    reply, stop = agent.answer(Stop())
    assert reply.ok
    assert stop
    assert agent.answer(Get(vault="/v"))[0].error == LOCKED
    assert "aaaa" not in repr(keys)
    assert "aaaa" not in repr(agent.answer(Status())[0])


def test_protocol_round_trip_and_malformed_messages() -> None:
    left, right = socket.socketpair(socket.AF_UNIX, socket.SOCK_STREAM)
    with left, right:
        send(left, Get(vault="/v"))
        assert read_request(right) == Get(vault="/v")
        for body in (b"not json", b'{"type": "steal"}', b'{"type": "get"}'):
            left.sendall(struct.pack(">I", len(body)) + body)
            with pytest.raises(ProtocolError):
                read_request(right)
        left.sendall(struct.pack(">I", 10**9))  # oversized: refused before reading it
        with pytest.raises(ProtocolError, match="over"):
            read_request(right)
