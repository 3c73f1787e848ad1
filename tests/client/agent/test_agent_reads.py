"""`list` and `search` answered by the key agent itself (issue 17, "a command with the agent
running <= 50 ms"; docs/agent.md "Read commands"): the `engram-sync` entry point's fast path
(client._cli.fast) and the agent's read thread (client._agent.reads), with the real agent
process, real SQLCipher vaults and the real CLI as subprocesses.

Each case runs the same command three ways and compares the bytes: the fast path alone
(exit 99 when it did not answer), the normal CLI (client._cli.main.main, which takes the
agent's keys), and the installed `engram-sync` executable."""

from __future__ import annotations

import inspect
import json
import os
import pty
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest
import rich.console
from rich.console import Console

from engram_sync.client._agent import control, messages
from engram_sync.client._agent.paths import SOCKET_NAME, agent_dir
from engram_sync.client._agent.reads import console_size
from engram_sync.client._agent.server import LOCKED, REFUSED
from engram_sync.client._cli import fast, support
from tests.client.agent.test_agent import PASSPHRASE, Env, agent_pid, ok, wait_gone

EXE = str(Path(sys.executable).parent / "engram-sync")
NOT_ANSWERED = 99
FAST_ONLY = (
    "import sys\n"
    "from engram_sync.client._cli.fast import fast_path\n"
    "code = fast_path(sys.argv[1:])\n"
    f"sys.exit({NOT_ANSWERED} if code is None else code)\n"
)
CLI_ONLY = (
    "import sys\n"
    "sys.argv = ['engram-sync', *sys.argv[1:]]\n"
    "from engram_sync.client._cli.main import main\n"
    "main()\n"
)


class Runs:
    """The user's environment and the three ways to run a command."""

    def __init__(self, env: Env, vault: Path) -> None:
        self.env = env
        self.vault = vault

    def environ(self, extra: dict[str, str] | None = None) -> dict[str, str]:
        environ = {k: v for k, v in os.environ.items() if not k.startswith("ENGRAM_")}
        for name in fast.RICH_ENVIRON:
            environ.pop(name, None)
        environ.update(
            HOME=str(self.env.home),
            XDG_CONFIG_HOME=str(self.env.home / "config"),
            XDG_RUNTIME_DIR=str(self.env.runtime),
            ENGRAM_VAULT=str(self.vault),
        )
        environ.update(extra or {})
        return environ

    def run(
        self,
        how: str,
        *args: str,
        extra: dict[str, str] | None = None,
        merged: bool = False,
        cwd: Path | None = None,
    ) -> subprocess.CompletedProcess[bytes]:
        argv = {
            "fast": [sys.executable, "-c", FAST_ONLY],
            "cli": [sys.executable, "-c", CLI_ONLY],
            "exe": [EXE],
        }[how]
        return subprocess.run(
            [*argv, *args],
            env=self.environ(extra),
            cwd=cwd or self.env.root,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT if merged else subprocess.PIPE,
            timeout=180,
            check=False,
        )

    def same_three_ways(
        self, *args: str, extra: dict[str, str] | None = None, merged: bool = False
    ) -> subprocess.CompletedProcess[bytes]:
        """The fast path answered, and the CLI and the executable print the same bytes."""
        answered = self.run("fast", *args, extra=extra, merged=merged)
        assert answered.returncode == 0, (args, answered)
        for how in ("cli", "exe"):
            other = self.run(how, *args, extra=extra, merged=merged)
            assert (other.returncode, other.stdout, other.stderr) == (
                answered.returncode,
                answered.stdout,
                answered.stderr,
            ), (how, args)
        return answered


@pytest.fixture(scope="module")
def runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Runs]:
    """A vault of varied memories (tags, projects, layers, a deleted one, several lines,
    markup-like and non-ASCII text, long lines), unlocked; the agent runs for the module."""
    root = tmp_path_factory.mktemp("agent-reads")
    runtime = root / "run"
    runtime.mkdir(mode=0o700)
    old_runtime = os.environ.get("XDG_RUNTIME_DIR")
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)  # this process asks the same agent
    env = Env(root, runtime)
    vault = root / "vault"
    try:
        ok(env.cli("init", "--force", passphrase=PASSPHRASE, vault=vault))
        memories = [
            ("deploy with make ship", ["ops", "deploy"], "infra", "semantic"),
            ("the deploy key rotates monthly\nsecond line of it", ["ops"], "infra", "episodic"),
            ("[bold]not markup[/bold] and {braces} über café ☕", ["ünïcode"], None, "episodic"),
            ("x" * 120 + " long deploy line", [], "infra", "imagined"),
            ("a memory that gets deleted deploy", ["ops"], None, "episodic"),
            ("plain note without tags", [], "home", "episodic"),
        ]
        ids = []
        for text, tags, project, layer in memories:
            args = ["add", text, "--layer", layer]
            for tag in tags:
                args += ["--tag", tag]
            if project:
                args += ["--project", project]
            ids.append(ok(env.cli(*args, passphrase=PASSPHRASE, vault=vault)).strip())
        ok(env.cli("delete", ids[4], passphrase=PASSPHRASE, vault=vault))
        ok(env.cli("unlock", passphrase=PASSPHRASE, vault=vault))
        yield Runs(env, vault)
    finally:
        pid = agent_pid()
        control.stop()
        if pid is not None and not wait_gone(pid):
            os.kill(pid, signal.SIGKILL)
        if old_runtime is None:
            os.environ.pop("XDG_RUNTIME_DIR", None)
        else:
            os.environ["XDG_RUNTIME_DIR"] = old_runtime


# --- the same bytes either way ---------------------------------------------------------------


@pytest.mark.parametrize(
    "args",
    [
        ("list",),
        ("list", "--json"),
        ("--debug", "list"),
        ("search", "deploy"),
        ("search", "deploy", "--json"),
        ("search", "--tag", "ops", "deploy"),
        ("search", "deploy", "--tag=ops", "--tag", "deploy", "--json"),
        ("search", "deploy", "--project", "infra", "--limit", "2"),
        ("search", "--layer", "semantic", "deploy", "--json"),
        ("search", "--limit=1", "deploy"),
        ("search", "deploy nothingmatchesthis"),  # no memory has both: any word, a note
        ("search", "nothingmatchesthis"),  # no result: a line on stderr
        ("search", "über"),
        ("search", "--", "markup"),
        ("search", '"unbalanced'),
    ],
    ids=" ".join,
)
def test_list_and_search_print_the_same_bytes_through_the_agent(
    runs: Runs, args: tuple[str, ...]
) -> None:
    runs.same_three_ways(*args)


def test_the_agent_output_shows_the_vaults_memories(runs: Runs) -> None:
    listed = json.loads(runs.same_three_ways("list", "--json").stdout)
    assert len(listed) == 5  # the deleted one is not listed
    assert {m["project"] for m in listed} == {"infra", "home", None}
    found = json.loads(runs.same_three_ways("search", "deploy", "--tag", "ops", "--json").stdout)
    assert {m["content"] for m in found["results"]} == {
        "deploy with make ship",
        "the deploy key rotates monthly\nsecond line of it",
    }


def test_stdout_and_stderr_keep_their_order(runs: Runs) -> None:
    both = runs.same_three_ways("search", "deploy nothingmatchesthis", merged=True).stdout
    note = b"no memory has every word"
    assert note in both
    assert both.index(note) < both.index(b"deploy")  # the note first, then the results


@pytest.mark.parametrize(
    "extra",
    [
        {"FORCE_COLOR": "1"},  # rich colours the JSON although stdout is a pipe
        {"FORCE_COLOR": "1", "NO_COLOR": "1", "COLUMNS": "40"},
        {"FORCE_COLOR": "1", "TERM": "dumb"},
        {"FORCE_COLOR": "1", "COLORTERM": "truecolor", "LINES": "5"},
    ],
)
def test_terminal_settings_give_the_same_bytes(runs: Runs, extra: dict[str, str]) -> None:
    answered = runs.same_three_ways("search", "deploy", "--json", extra=extra)
    if "NO_COLOR" not in extra and extra.get("TERM") != "dumb":
        assert b"\x1b[" in answered.stdout  # the case does reach rich's colours


def _on_a_terminal(argv: list[str], env: dict[str, str]) -> tuple[int, bytes]:
    """Run with stdout and stderr on one pseudo-terminal: exit status and every byte seen."""
    master, replica = pty.openpty()
    with subprocess.Popen(argv, env=env, stdin=subprocess.DEVNULL, stdout=replica,
                          stderr=replica) as proc:  # fmt: skip
        os.close(replica)
        seen = b""
        while True:
            try:
                chunk = os.read(master, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
    os.close(master)
    return proc.returncode, seen


def test_on_a_real_terminal_the_same_bytes(runs: Runs) -> None:
    env = runs.environ({"TERM": "xterm-256color"})
    for args in (["search", "deploy", "--json"], ["list"], ["search", "deploy zzzq"]):
        fast_code, fast_seen = _on_a_terminal([sys.executable, "-c", FAST_ONLY, *args], env)
        assert fast_code == 0
        assert (0, fast_seen) == _on_a_terminal([sys.executable, "-c", CLI_ONLY, *args], env)
        assert (0, fast_seen) == _on_a_terminal([EXE, *args], env)
    assert b"\x1b[" in _on_a_terminal([EXE, "search", "deploy", "--json"], env)[1]


def test_vault_named_in_the_registry_relative_or_by_option(runs: Runs) -> None:
    ok(runs.env.cli("vaults", "add", "work", str(runs.vault)))
    named = runs.same_three_ways("--vault", "work", "list")
    assert named.stdout == runs.run("fast", "list").stdout
    relative = runs.run("fast", "--vault=vault", "list", cwd=runs.env.root)
    assert relative.returncode == 0
    assert relative.stdout == named.stdout
    elsewhere = runs.run("fast", "list", extra={"ENGRAM_VAULT": "./vault"}, cwd=runs.vault)
    assert elsewhere.returncode == NOT_ANSWERED  # ./vault from inside the vault: no vault


@pytest.mark.parametrize(
    "args",
    [
        ("list", "extra"),
        ("search",),
        ("search", "a", "b"),
        ("search", "--limit", "0", "deploy"),
        ("search", "--limit", "x", "deploy"),
        ("search", "-x"),
        ("search", "--unknown", "deploy"),
        ("search", "   "),  # the CLI's own error, in its words
        ("search", "--layer", "nope", "deploy"),
        ("list", "--help"),
        ("--version",),
        ("status",),
        ("list", "--vault", "x"),
    ],
    ids=" ".join,
)
def test_anything_else_is_left_to_the_cli(runs: Runs, args: tuple[str, ...]) -> None:
    assert runs.run("fast", *args).returncode == NOT_ANSWERED
    # and the executable prints what the CLI prints
    exe, cli = runs.run("exe", *args), runs.run("cli", *args)
    assert (exe.returncode, exe.stdout, exe.stderr) == (cli.returncode, cli.stdout, cli.stderr)


# --- fresh reads, and fallbacks ----------------------------------------------------------------


def test_a_change_by_another_process_is_read_at_once(runs: Runs) -> None:
    before = runs.run("fast", "list", "--json")
    assert before.returncode == 0
    added = ok(runs.env.cli("add", "added by another process zebra", vault=runs.vault)).strip()
    after = runs.same_three_ways("list", "--json")
    assert added in after.stdout.decode()
    assert added not in before.stdout.decode()
    assert json.loads(runs.same_three_ways("search", "zebra", "--json").stdout)["results"]
    ok(runs.env.cli("delete", added, vault=runs.vault))
    assert added not in runs.same_three_ways("list").stdout.decode()


def test_a_vault_the_agent_does_not_hold_is_left_to_the_cli(runs: Runs) -> None:
    other = runs.env.root / "other"
    ok(runs.env.cli("init", "--force", passphrase=PASSPHRASE, vault=other))
    ok(runs.env.cli("add", "only in the other vault", passphrase=PASSPHRASE, vault=other))
    extra = {"ENGRAM_VAULT": str(other), "ENGRAM_PASSPHRASE": PASSPHRASE}
    assert runs.run("fast", "list", extra=extra).returncode == NOT_ANSWERED
    exe = runs.run("exe", "list", extra=extra)
    assert exe.returncode == 0
    assert b"only in the other vault" in exe.stdout
    # the agent's side: a read of a vault it holds no keys for is `locked`, nothing else
    terminal = messages.Terminal(False, False, "utf-8", "strict", "utf-8", "strict", None, {})
    reply = control.ask(messages.Read(vault=str(other.resolve()), command="list",
                                      terminal=terminal))  # fmt: skip
    assert reply is not None
    assert (reply.ok, reply.error, reply.chunks) == (False, LOCKED, [])


def test_stopped_agent_and_stale_socket_leave_it_to_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    env = Env(tmp_path, runtime)
    vault = tmp_path / "vault"
    ok(env.cli("init", "--force", passphrase=PASSPHRASE, vault=vault))
    ok(env.cli("add", "kept", passphrase=PASSPHRASE, vault=vault))
    local = Runs(env, vault)
    ok(env.cli("unlock", passphrase=PASSPHRASE, vault=vault))
    answered = local.run("fast", "list")
    assert answered.returncode == 0  # the positive case
    pid = agent_pid()
    assert pid is not None
    os.kill(pid, signal.SIGKILL)
    assert wait_gone(pid)
    assert (runtime / "engram-sync" / SOCKET_NAME).exists()  # a dead agent's socket
    assert local.run("fast", "list").returncode == NOT_ANSWERED
    exe = local.run("exe", "list", extra={"ENGRAM_PASSPHRASE": PASSPHRASE})
    assert (exe.returncode, exe.stdout) == (0, answered.stdout)
    ok(env.cli("unlock", passphrase=PASSPHRASE, vault=vault))
    assert local.run("fast", "list").stdout == answered.stdout
    ok(env.cli("lock"))
    assert local.run("fast", "list").returncode == NOT_ANSWERED  # stopped: no socket
    assert "no passphrase" in local.run("exe", "list").stderr.decode()


def test_lock_of_the_vault_closes_it_and_reads_stop(runs: Runs) -> None:
    assert runs.run("fast", "list").returncode == 0
    assert control.forget(runs.vault)
    try:
        assert runs.run("fast", "list").returncode == NOT_ANSWERED
    finally:
        ok(runs.env.cli("unlock", passphrase=PASSPHRASE, vault=runs.vault))
    assert runs.run("fast", "list").returncode == 0


_READ_AS_NOBODY = """
import json, os, socket, struct, sys
os.setgid(65534)
os.setuid(65534)
sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
sock.settimeout(10)
sock.connect(sys.argv[1])
terminal = {"stdout_isatty": False, "stderr_isatty": False, "stdout_encoding": "utf-8",
            "stdout_errors": "strict", "stderr_encoding": "utf-8", "stderr_errors": "strict",
            "size": None, "environ": {}}
body = json.dumps({"type": "read", "vault": sys.argv[2], "command": "list",
                   "terminal": terminal}).encode()
try:
    sock.sendall(struct.pack(">I", len(body)) + body)
except BrokenPipeError:
    pass
data = b""
while True:
    try:
        chunk = sock.recv(65536)
    except ConnectionResetError:  # hung up on with our request unread: all was sent
        break
    if not chunk:
        break
    data += chunk
(n,) = struct.unpack(">I", data[:4])
print(json.dumps({"reply": json.loads(data[4:4 + n]), "after": len(data) - 4 - n}))
"""


@pytest.mark.skipif(os.getuid() != 0, reason="needs root to run a client as nobody")
def test_another_uid_gets_no_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    runtime = Path(tempfile.mkdtemp(prefix="engram-agent-reads-uid-", dir="/tmp"))
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    env = Env(tmp_path, runtime)
    vault = tmp_path / "vault"
    try:
        ok(env.cli("init", "--force", passphrase=PASSPHRASE, vault=vault))
        ok(env.cli("add", "secret memory text", passphrase=PASSPHRASE, vault=vault))
        ok(env.cli("unlock", passphrase=PASSPHRASE, vault=vault))
        sock = agent_dir() / SOCKET_NAME
        os.chmod(runtime, 0o711)
        os.chmod(agent_dir(), 0o711)
        os.chmod(sock, 0o666)
        done = subprocess.run(
            [sys.executable, "-c", _READ_AS_NOBODY, str(sock), str(vault.resolve())],
            capture_output=True, text=True, timeout=60, check=False,
        )  # fmt: skip
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout)
        assert seen["reply"]["ok"] is False
        assert seen["reply"]["error"] == REFUSED
        assert seen["after"] == 0  # no output follows
        assert "secret memory text" not in done.stdout
        # the positive case: this uid's fast path reads it over the same socket
        local = Runs(env, vault)
        assert b"secret memory text" in local.run("fast", "list").stdout
    finally:
        pid = agent_pid()
        control.stop()
        if pid is not None and not wait_gone(pid):
            os.kill(pid, signal.SIGKILL)
        for path in sorted(runtime.rglob("*"), reverse=True):
            path.unlink() if not path.is_dir() else path.rmdir()
        runtime.rmdir()


def _answer_once(listener: socket.socket, raw: bytes) -> threading.Thread:
    """Accept one connection, read its request, send `raw`, hang up (in a thread)."""

    def answer() -> None:
        conn, _ = listener.accept()
        with conn:
            (length,) = struct.unpack(">I", conn.recv(4, socket.MSG_WAITALL))
            conn.recv(length, socket.MSG_WAITALL)
            conn.sendall(raw)

    thread = threading.Thread(target=answer)
    thread.start()
    return thread


def _framed(reply: object, tail: bytes = b"") -> bytes:
    body = reply if isinstance(reply, bytes) else json.dumps(reply).encode()
    return struct.pack(">I", len(body)) + body + tail


def test_a_malformed_reply_is_left_to_the_cli(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A socket that answers garbage, a refusal, a bad size or too few bytes is no agent."""
    runtime = tmp_path / "run"
    (runtime / "engram-sync").mkdir(parents=True, mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(runtime))
    request = {"type": "read", "vault": "/nowhere", "command": "list"}
    bad = [
        _framed(b"not json"),
        _framed({"ok": False, "error": "locked"}),
        _framed({"ok": True, "exit_code": 0, "chunks": [[1, -1]]}),
        _framed({"ok": True, "exit_code": 0, "chunks": [[3, 1]]}, b"x"),
        _framed({"ok": True, "exit_code": 0, "chunks": [[1, fast.MAX_OUTPUT + 1]]}),
        _framed({"ok": True, "exit_code": "0", "chunks": []}),
        _framed({"ok": True, "exit_code": 0, "chunks": [[1, 10]]}, b"short"),
        struct.pack(">I", 100) + b"{}",
    ]
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        listener.bind(str(runtime / "engram-sync" / SOCKET_NAME))
        listener.listen(4)
        for raw in bad:
            thread = _answer_once(listener, raw)
            assert fast.ask_agent(dict(request)) is None, raw
            thread.join(10)
        # the positive case: a well-formed reply is taken, its chunks in order
        good = _framed({"ok": True, "exit_code": 0, "chunks": [[1, 3], [2, 2]]}, b"outer")
        thread = _answer_once(listener, good)
        assert fast.ask_agent(dict(request)) == (0, [(1, b"out"), (2, b"er")])
        thread.join(10)


# --- the pieces ----------------------------------------------------------------------------------


def test_parse_takes_exactly_the_cli_options() -> None:
    assert fast.parse(["list"]) == (None, {"command": "list", "json_out": False})
    assert fast.parse(["--vault", "v", "--debug", "list", "--json"]) == (
        "v",
        {"command": "list", "json_out": True},
    )
    assert fast.parse(
        [
            "search",
            "q",
            "--tag",
            "a",
            "--tag=b",
            "--limit",
            "3",
            "--json",
            "--project",
            "p",
            "--layer=semantic",
            "--debug",
        ]
    ) == (
        None,
        {
            "command": "search",
            "json_out": True,
            "query": "q",
            "tags": ["a", "b"],
            "limit": 3,
            "project": "p",
            "layer": "semantic",
        },
    )
    assert fast.parse(["search", "--", "-q"]) == (
        None,
        {"command": "search", "json_out": False, "query": "-q", "tags": []},
    )
    for refused in (
        [], ["--help"], ["list", "--jso"], ["--debug", "--debug", "list"], ["--vault"],
        ["--vault", "", "list"], ["search", "--limit", "01", "q"], ["search", "--tag"],
        ["search", "q", "--tag", "--json"], ["show", "x"], ["search", "--json=1", "q"],
    ):  # fmt: skip
        assert fast.parse(refused) is None, refused


def test_the_defaults_match_the_clis() -> None:
    assert Path(fast.DEFAULT_VAULT) == support.DEFAULT_VAULT
    assert fast.MAX_OUTPUT == messages.MAX_OUTPUT


def test_rich_environ_lists_every_variable_rich_reads() -> None:
    source = inspect.getsource(rich.console)
    read = set(re.findall(r"""environ\.get\(\s*["']([A-Z_]+)["']""", source))
    read |= set(re.findall(r"""getenv\(\s*["']([A-Z_]+)["']""", source))
    read.discard("DATABRICKS_RUNTIME_VERSION")  # Jupyter only: the agent is no notebook
    assert read  # the check sees rich's reads
    assert read <= set(fast.RICH_ENVIRON)


class _FakeTty:
    def __init__(self, tty: bool) -> None:
        self.tty = tty
        self.encoding = "utf-8"

    def isatty(self) -> bool:
        return self.tty

    def write(self, text: str) -> int:
        return len(text)

    def flush(self) -> None:
        pass


@pytest.mark.parametrize("tty", [True, False])
@pytest.mark.parametrize("fd_size", [None, (132, 43), (0, 0)])
@pytest.mark.parametrize(
    "environ",
    [{}, {"COLUMNS": "50"}, {"LINES": "7"}, {"COLUMNS": "50", "LINES": "7"}, {"TERM": "dumb"},
     {"TERM": "dumb", "COLUMNS": "60", "LINES": "9"}, {"TERM": "unknown", "COLUMNS": "61"},
     {"COLUMNS": "0"}, {"COLUMNS": "x"}],
)  # fmt: skip
def test_console_size_is_riches_with_the_commands_terminal(
    monkeypatch: pytest.MonkeyPatch,
    tty: bool,
    fd_size: tuple[int, int] | None,
    environ: dict[str, str],
) -> None:
    def terminal_size(fd: int) -> os.terminal_size:
        if fd_size is None:
            raise OSError("not a terminal")
        return os.terminal_size(fd_size)

    monkeypatch.setattr(os, "get_terminal_size", terminal_size)
    made = Console(file=_FakeTty(tty), _environ=environ)  # type: ignore[arg-type]
    expected = (made.size.width, made.size.height)
    assert console_size(made, environ, fd_size) == expected
