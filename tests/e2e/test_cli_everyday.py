"""The everyday `engram-sync` behaviours of issue 17 ("Polish"), through the real
executable against a real relay: a relink pushes everything, `status` after a revocation,
Ctrl-C during a sync, a wrong relay URL, weak passphrases, user text printed literally,
and `watch` on a vault that is not linked."""

from __future__ import annotations

import asyncio
import json
import os
import pty
import signal
import subprocess
import sys
import threading
from pathlib import Path

import asyncpg

from engram_sync.relay.db.url import to_libpq_url
from tests.e2e.helpers import stderr_on_a_terminal
from tests.relay.conftest import ADMIN_KEY, Relay, free_port
from tests.relay.support import wait_for

EXE = str(Path(sys.executable).parent / "engram-sync")
PASSPHRASE = "everyday correct horse battery staple"


def cli(
    vault: Path, *args: str, env: dict[str, str] | None = None, timeout: float = 120
) -> subprocess.CompletedProcess[str]:
    full = dict(os.environ, ENGRAM_PASSPHRASE=PASSPHRASE, HOME=str(vault.parent), COLUMNS="200")
    full.pop("ENGRAM_VAULT", None)
    full.update(env or {})
    return subprocess.run(
        [EXE, "--vault", str(vault), *args],
        env=full,
        cwd=vault.parent,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    return result.stdout


def _link(vault: Path, relay: Relay, vault_id: str) -> None:
    ok(cli(vault, "link", "--relay", relay.url, "--api-key", ADMIN_KEY, "--vault-id", vault_id))


def _relay_holds(relay: Relay, vault_id: str) -> dict[str, bool]:
    """memory id -> deleted, of every blob the relay holds for the vault."""
    with relay.client() as admin:
        page = admin.get(f"/v1/vaults/{vault_id}/pull", params={"cursor": 0}).json()
    assert not page["has_more"]
    return {blob["memory_id"]: blob["deleted"] for blob in page["blobs"]}


def test_link_to_a_new_relay_vault_pushes_every_memory_and_tombstone(
    tmp_path: Path, relay: Relay
) -> None:
    vault = tmp_path / "vault"
    ok(cli(vault, "init"))
    ids = [ok(cli(vault, "add", f"memory {n}")).strip() for n in range(5)]
    _link(vault, relay, "first-home")
    ok(cli(vault, "sync"))
    ok(cli(vault, "delete", ids[0]))
    ok(cli(vault, "sync"))
    first = _relay_holds(relay, "first-home")
    assert first == {ids[0]: True, **{memory_id: False for memory_id in ids[1:]}}

    _link(vault, relay, "second-home")  # the same relay, a new vault: nothing there yet
    report = json.loads(ok(cli(vault, "sync", "--json")))
    assert report["pushed"] == 4 + 1, report  # the four memories and the deletion
    assert report["digest"]["requeued"] == 0  # queued by the link's first pull, not the check
    assert _relay_holds(relay, "second-home") == first
    again = json.loads(ok(cli(vault, "sync", "--json")))
    assert again["pushed"] == 0


def test_status_after_a_revocation_says_so_and_what_to_do(tmp_path: Path, relay: Relay) -> None:
    admin, phone = tmp_path / "admin", tmp_path / "phone"
    for vault in (admin, phone):
        ok(cli(vault, "init"))
        _link(vault, relay, "revoked-home")
    ok(cli(phone, "add", "written on the phone"))
    ok(cli(phone, "sync"))
    phone_id = json.loads(ok(cli(phone, "status", "--json")))["device_id"]
    fine = ok(cli(phone, "status"))
    assert "last_error: none" in fine  # the positive case: nothing to report
    assert "revoked" not in fine.split("revoked: False")[1]
    ok(cli(admin, "revoke", phone_id))
    ok(cli(phone, "add", "written after the revocation"))  # its push is refused

    failed = cli(phone, "sync")
    assert failed.returncode == 1
    assert f"this device ({phone_id}) was revoked" in failed.stderr
    shown = ok(cli(phone, "status"))
    assert "last_error: None" not in shown
    assert f"last_error: this device ({phone_id}) was revoked for vault revoked-home" in shown
    assert "run `engram-sync link`" in shown  # what to do
    status = json.loads(ok(cli(phone, "status", "--json")))
    assert status["revoked"] is True
    assert "was revoked" in status["last_error"]


class _VaultRowLock:
    """Holds the relay's row lock of a vault (what every push takes, relay.store.push) in a
    thread, so a push waits on it until `release()`: a sync stopped mid-way, on purpose."""

    def __init__(self, relay: Relay, vault_id: str) -> None:
        self.relay, self.vault_id = relay, vault_id
        self._held, self._release = threading.Event(), threading.Event()
        self._thread = threading.Thread(target=lambda: asyncio.run(self._hold()), daemon=True)

    async def _hold(self) -> None:
        conn = await asyncpg.connect(to_libpq_url(self.relay.database_url))
        try:
            async with conn.transaction():
                await conn.execute(
                    "SELECT 1 FROM vaults WHERE vault_id = $1 FOR UPDATE", self.vault_id
                )
                self._held.set()
                await asyncio.to_thread(self._release.wait)
        finally:
            await conn.close()

    def __enter__(self) -> _VaultRowLock:
        self._thread.start()
        assert self._held.wait(60)
        return self

    def waiters(self) -> int:
        rows = self.relay.sql(
            "SELECT count(*) AS n FROM pg_stat_activity"
            " WHERE wait_event_type = 'Lock' AND datname = current_database()"
        )
        return int(rows[0]["n"])

    def __exit__(self, *exc: object) -> None:
        self._release.set()
        self._thread.join(60)


def test_ctrl_c_during_a_sync_says_what_was_kept_and_the_next_sync_resumes(
    tmp_path: Path, relay: Relay
) -> None:
    other, mine = tmp_path / "other", tmp_path / "mine"
    for vault in (other, mine):
        ok(cli(vault, "init"))
        _link(vault, relay, "interrupted-home")
    for n in range(3):
        ok(cli(other, "add", f"from the other device {n}"))
    ok(cli(other, "sync"))
    ok(cli(mine, "add", "waiting to be pushed"))

    env = dict(os.environ, ENGRAM_PASSPHRASE=PASSPHRASE, HOME=str(tmp_path))
    with _VaultRowLock(relay, "interrupted-home") as lock:
        # SIGINT back to its default in the child: a shell runs background jobs with SIGINT
        # ignored, a child inherits that, and Python then installs no KeyboardInterrupt.
        proc = subprocess.Popen(
            [EXE, "--vault", str(mine), "sync"], env=env, stdout=subprocess.PIPE,
            stderr=subprocess.PIPE, text=True,
            preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_DFL),
        )  # fmt: skip
        wait_for(
            lambda: lock.waiters() > 0 or proc.poll() is not None, "the push to wait", every=0.2
        )
        assert proc.poll() is None, proc.communicate()
        proc.send_signal(signal.SIGINT)  # what Ctrl-C sends
        stdout, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 130, stdout + stderr
    assert "Traceback" not in stderr
    assert "interrupted: kept what was done before Ctrl-C: pulled 3 (applied 3), pushed 0" in (
        stderr
    )
    assert "the cursor (3) is saved: the next `engram-sync sync` resumes there" in stderr

    again = json.loads(ok(cli(mine, "sync", "--json")))
    assert again["applied"] == 0  # the three pulled before Ctrl-C are not pulled again
    assert len(_relay_holds(relay, "interrupted-home")) == 4


def test_user_text_is_printed_literally(tmp_path: Path) -> None:
    vault = tmp_path / "vault"
    ok(cli(vault, "init"))
    text = "[bold]loud[/bold] and [x] done, [red]not red[/red]"
    memory_id = ok(cli(vault, "add", text)).strip()
    listed = ok(cli(vault, "list"))
    assert f"{memory_id}  " in listed
    assert text in listed  # rich markup would print "loud and  done, not red"
    found = ok(cli(vault, "search", "done"))
    assert text in found
    missing = cli(vault, "show", "[x]")
    assert missing.returncode == 1
    assert "no memory '[x]'" in missing.stderr
    # the positive case: the same text through rich's markup loses its brackets
    from rich.console import Console

    console = Console(record=True, width=200)
    console.print(text)
    assert text not in console.export_text()


def test_a_wrong_relay_url_fails_in_one_line_naming_it(tmp_path: Path) -> None:
    vault = tmp_path / "vault"
    ok(cli(vault, "init"))
    url = f"http://127.0.0.1:{free_port()}"  # nothing listens there
    wrong = cli(vault, "link", "--relay", url, "--api-key", ADMIN_KEY,
                env={"ENGRAM_CONNECT_TIMEOUT": "1"})  # fmt: skip
    assert wrong.returncode == 1
    lines = wrong.stderr.strip().splitlines()
    assert len(lines) == 1, wrong.stderr
    assert lines[0].startswith(f"error: the relay at {url} could not be reached (ConnectError")
    assert "within 1 s; check the relay URL and your network" in lines[0]
    assert "ENGRAM_CONNECT_TIMEOUT=SECONDS" in lines[0]
    bad = cli(vault, "link", "--relay", url, "--api-key", ADMIN_KEY,
              env={"ENGRAM_CONNECT_TIMEOUT": "soon"})  # fmt: skip
    assert bad.returncode == 1
    assert "ENGRAM_CONNECT_TIMEOUT='soon' is not a number of seconds" in bad.stderr


def _init_on_a_terminal(vault: Path, passphrase: str, answer: str) -> tuple[int, str]:
    """`init` with stdin on a pseudo-terminal, answering the confirmation with `answer`."""
    master, replica = pty.openpty()
    env = dict(os.environ, ENGRAM_PASSPHRASE=passphrase, HOME=str(vault.parent))
    with subprocess.Popen(
        [EXE, "--vault", str(vault), "init"], env=env, stdin=replica, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True,
    ) as proc:  # fmt: skip
        os.close(replica)
        os.write(master, answer.encode() + b"\n")
        _, stderr = proc.communicate(timeout=120)
    os.close(master)
    return proc.returncode, stderr


def test_init_names_a_weak_passphrase_and_asks(tmp_path: Path) -> None:
    weak = {"ENGRAM_PASSPHRASE": "abc"}
    refused = cli(tmp_path / "scripted", "init", env=weak)  # no terminal: refused
    assert refused.returncode == 1
    assert "warning: the passphrase is weak: strength 0/4" in refused.stderr
    assert "pass --force to keep it" in refused.stderr
    assert not (tmp_path / "scripted" / "engrams.db").exists()
    forced = cli(tmp_path / "scripted", "init", "--force", env=weak)
    assert forced.returncode == 0, forced.stderr
    assert "warning: the passphrase is weak" in forced.stderr
    assert "--force: kept anyway" in forced.stderr

    code, stderr = _init_on_a_terminal(tmp_path / "asked-no", "abc", "n")
    assert code == 1
    assert "Use this weak passphrase anyway?" in stderr
    assert not (tmp_path / "asked-no" / "engrams.db").exists()
    code, stderr = _init_on_a_terminal(tmp_path / "asked-yes", "abc", "y")
    assert code == 0, stderr
    assert (tmp_path / "asked-yes" / "engrams.db").exists()

    strong = cli(tmp_path / "strong", "init")  # the positive case: no warning, no question
    assert strong.returncode == 0
    assert "weak" not in strong.stderr


def test_sync_progress_on_a_terminal_shows_the_pull_total_and_an_eta(
    tmp_path: Path, relay: Relay
) -> None:
    writer, reader = tmp_path / "writer", tmp_path / "reader"
    for vault in (writer, reader):
        ok(cli(vault, "init"))
        _link(vault, relay, "progress-home")
    source = tmp_path / "many.jsonl"
    source.write_text(
        "".join(json.dumps({"content": f"memory number {n}"}) + "\n" for n in range(1200)),
        encoding="utf-8",
    )
    ok(cli(writer, "import", str(source)))
    ok(cli(writer, "sync"))

    env = dict(os.environ, ENGRAM_PASSPHRASE=PASSPHRASE, HOME=str(tmp_path), COLUMNS="160")
    result, terminal = stderr_on_a_terminal([EXE, "--vault", str(reader), "sync"], env)
    stdout = result.stdout
    assert result.returncode == 0, terminal
    assert "pulled 1200 (applied 1200)" in stdout
    text = terminal.decode("utf-8", "replace")
    assert "pulling" in text
    assert "/1200" in text  # the total is known: the vault's sequence minus the cursor
    assert "eta" in text
    piped = cli(reader, "sync")  # the positive case of the terminal check: no bar on a pipe
    assert "pulling" not in piped.stderr
    assert "\x1b" not in piped.stderr


def test_watch_ends_at_once_when_the_relay_refuses_the_request_itself(
    tmp_path: Path, relay: Relay
) -> None:
    vault = tmp_path / "vault"
    ok(cli(vault, "init"))
    _link(vault, relay, "watched-home")
    config_path = vault / "config.json"
    config = json.loads(config_path.read_text(encoding="utf-8"))
    config["sync"]["vault_id"] = "v" * 300  # no relay takes it (PROTOCOL §6: 1..256)
    config_path.write_text(json.dumps(config), encoding="utf-8")
    done = cli(vault, "watch", "--interval", "1", timeout=120)  # retried forever before
    assert done.returncode == 1, done.stderr
    assert "error: " in done.stderr
    assert "(HTTP 4" in done.stderr  # the relay's refusal, in one line

    # the positive case: what may pass by itself is still retried
    from engram_sync.client._cli.main import _watch_retries
    from engram_sync.client._errors import RateLimitedError, RelayError, RelayUnavailableError

    assert _watch_retries(RelayUnavailableError("down", url=relay.url))
    assert _watch_retries(RateLimitedError("rate_limited", "slow down"))
    assert _watch_retries(RelayError(503, "unavailable", "database down"))
    assert not _watch_retries(RelayError(422, "invalid", "refused"))
