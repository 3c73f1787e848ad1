"""Slowloris (issue 14 item 6): header and body read timeouts and the per-process connection
cap of relay.serving.connections, against a real `engram-relay serve` process on loopback.

Bounded counts only: how many connections the relay holds (never more than the cap), that
every half-open one is eventually closed (polled with a generous deadline), and that a
normal client's requests all succeed while an attacker keeps re-opening half-open ones.
"""

from __future__ import annotations

import json
import os
import resource
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import psutil
import pytest

from engram_sync.relay.serving.connections import (
    MAX_HEADER_BYTES,
    ConnectionLimits,
    ensure_fd_limit,
    limits_from_env,
)
from tests.relay.conftest import ADMIN_KEY, free_port
from tests.relay.support import (
    Sealer,
    migrated_database,
    new_vault_id,
    pull_ok,
    push,
    push_ok,
    wire,
)

BIN = Path(sys.executable).parent
CAP = 50
HEADER_TIMEOUT_S = 1
BODY_TIMEOUT_S = 3
EVENTUALLY_S = 60.0  # generous: "closed" means closed within this, on a busy 2-core machine
HALF_REQUEST = b"GET /health HTTP/1.1\r\nHost: relay\r\nUser-Agent: slow"


@dataclass
class GuardedRelay:
    url: str
    port: int
    proc: subprocess.Popen[bytes]
    log_path: Path

    def held(self) -> int:
        """Client connections the relay process holds open right now."""
        conns = psutil.Process(self.proc.pid).net_connections("tcp")
        return sum(1 for c in conns if c.laddr.port == self.port and c.raddr)

    def log_records(self) -> list[dict[str, object]]:
        records = []
        for line in self.log_path.read_text(errors="replace").splitlines():
            if line.startswith("{"):
                records.append(json.loads(line))
        return records


@pytest.fixture(scope="module")
def relay(postgres_url: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[GuardedRelay]:
    port = free_port()
    log_path = tmp_path_factory.mktemp("slowloris") / "relay.log"
    env = {k: v for k, v in os.environ.items() if "DATABASE_URL" not in k}
    env.update(
        SYNC_API_KEYS=f"{ADMIN_KEY}:100000",
        ENGRAM_RELAY_HEADER_TIMEOUT_S=str(HEADER_TIMEOUT_S),
        ENGRAM_RELAY_BODY_TIMEOUT_S=str(BODY_TIMEOUT_S),
        ENGRAM_RELAY_MAX_CONNECTIONS=str(CAP),
    )
    with migrated_database(postgres_url) as url, log_path.open("wb") as log:
        cmd = [str(BIN / "engram-relay"), "serve", "--port", str(port), "--database-url", url,
               "--log-format", "json", "--log-level", "info"]  # fmt: skip
        proc = subprocess.Popen(cmd, env=env, stdout=log, stderr=log)
        try:
            base = f"http://127.0.0.1:{port}"
            deadline = time.monotonic() + 60
            while True:
                assert proc.poll() is None, log_path.read_text()
                try:
                    if httpx.get(f"{base}/ready", timeout=2).status_code == 200:
                        break
                except httpx.TransportError:
                    pass
                assert time.monotonic() < deadline, "relay did not start"
                time.sleep(0.05)
            yield GuardedRelay(base, port, proc, log_path)
        finally:
            proc.terminate()
            proc.wait(timeout=60)


def _half_open(port: int, payload: bytes = HALF_REQUEST) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=10)
    sock.sendall(payload)
    return sock


def _read_until_closed(sock: socket.socket, deadline: float) -> bytes | None:
    """What the relay sent before it closed `sock`, or None if it is still open at
    `deadline`."""
    received = b""
    sock.settimeout(0.2)
    while time.monotonic() < deadline:
        try:
            chunk = sock.recv(65536)
        except TimeoutError:
            continue
        except ConnectionResetError:
            return received
        if not chunk:
            return received
        received += chunk
    return None


def _answer_before_close(sock: socket.socket) -> bytes | None:
    """`_read_until_closed` within EVENTUALLY_S; `sock` is closed after."""
    try:
        return _read_until_closed(sock, time.monotonic() + EVENTUALLY_S)
    finally:
        sock.close()


def _assert_refused(answer: bytes | None, status: int, code: str, held: str) -> None:
    """The relay answered `status` with error `code`, then closed (None: it still held
    the connection, `held` says which)."""
    assert answer is not None, f"the relay still holds {held}"
    assert answer.startswith(f"HTTP/1.1 {status} ".encode()), answer
    assert f'"code": "{code}"'.encode() in answer


def _read_response(sock: socket.socket) -> bytes:
    """One whole response with a content-length (the connection stays open)."""
    data = b""
    while b"\r\n\r\n" not in data:
        data += sock.recv(65536)
    head, _, body = data.partition(b"\r\n\r\n")
    length = int(head.lower().split(b"content-length: ")[1].split(b"\r\n")[0])
    while len(body) < length:
        body += sock.recv(65536)
    return head + b"\r\n\r\n" + body


def _wait_held_at_most(relay: GuardedRelay, count: int) -> int:
    deadline = time.monotonic() + EVENTUALLY_S
    while (held := relay.held()) > count and time.monotonic() < deadline:
        time.sleep(0.1)
    return held


def _client(relay: GuardedRelay) -> httpx.Client:
    # A new connection per request: each one has to get past the cap while it is full.
    headers = {"Authorization": f"Bearer {ADMIN_KEY}", "Connection": "close"}
    return httpx.Client(base_url=relay.url, headers=headers, timeout=30)


def test_a_normal_client_is_served_while_an_attacker_keeps_the_cap_full(
    relay: GuardedRelay,
) -> None:
    """An attacker keeps ~200 half-open connections coming (4x the cap of 50): the relay
    never holds more than the cap, and every request of a normal client succeeds."""
    stop = threading.Event()
    opened = 0
    held_seen: list[int] = []

    def attack() -> None:
        nonlocal opened
        live: list[socket.socket] = []
        while not stop.is_set():
            while len(live) < 200 and not stop.is_set():
                try:
                    live.append(_half_open(relay.port))
                    opened += 1
                except OSError:
                    break
                time.sleep(0.002)  # a few hundred a second: the cap churns, the box copes
            # drop the ones the relay closed, re-open as many
            still = []
            for sock in live:
                sock.setblocking(False)
                try:
                    gone = sock.recv(4096) == b""
                except BlockingIOError:
                    gone = False
                except OSError:
                    gone = True
                if gone:
                    sock.close()
                else:
                    still.append(sock)
            live = still
        for sock in live:
            sock.close()

    attacker = threading.Thread(target=attack, daemon=True)
    attacker.start()
    sealer = Sealer(new_vault_id("slowloris"))
    try:
        deadline = time.monotonic() + EVENTUALLY_S
        while opened < 400 and time.monotonic() < deadline:  # the cap is full and churning
            time.sleep(0.05)
        assert opened >= 400
        with _client(relay) as http:
            for i in range(10):
                assert http.get("/health").status_code == 200
                push_ok(http, sealer.vault_id, [sealer.blob(f"m{i}", 1)])
                held_seen.append(relay.held())
                assert pull_ok(http, sealer.vault_id, cursor=0)["cursor"] == i + 1
                held_seen.append(relay.held())
    finally:
        stop.set()
        attacker.join(timeout=60)
    assert opened >= 400
    # The cap, plus a few the relay is closing (it closes the oldest half-open one when a
    # new one arrives, and a burst may be accepted before those closes complete).
    assert max(held_seen) <= CAP + 10, held_seen


def test_half_open_connections_are_closed_after_the_header_timeout(relay: GuardedRelay) -> None:
    """Fewer than the cap (nothing is evicted): each is closed by the header timeout, a
    connection that sent nothing silently, a half-sent request with a 408; a second
    request half sent on a keep-alive connection after a first one too. A complete
    request on another connection meanwhile gets its answer."""
    nothing = [socket.create_connection(("127.0.0.1", relay.port)) for _ in range(10)]
    half = [_half_open(relay.port) for _ in range(10)]
    keep_alive = _half_open(relay.port, b"GET /health HTTP/1.1\r\nHost: relay\r\n\r\n")
    assert _read_response(keep_alive).startswith(b"HTTP/1.1 200 ")
    keep_alive.sendall(HALF_REQUEST)
    with httpx.Client(base_url=relay.url, timeout=30) as http:
        assert http.get("/health").status_code == 200
    deadline = time.monotonic() + EVENTUALLY_S
    try:
        for sock in nothing:
            assert _read_until_closed(sock, deadline) == b""
        for sock in [*half, keep_alive]:
            answer = _read_until_closed(sock, deadline)
            _assert_refused(answer, 408, "header_timeout", "a half-open connection")
    finally:
        for sock in [*nothing, *half, keep_alive]:
            sock.close()
    assert _wait_held_at_most(relay, 0) == 0


def _stalled_push(relay: GuardedRelay, body: bytes) -> socket.socket:
    head = (
        f"POST /v1/vaults/{new_vault_id('stall')}/push HTTP/1.1\r\nHost: relay\r\n"
        f"Authorization: Bearer {ADMIN_KEY}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    return _half_open(relay.port, head + body[: len(body) // 2])


def test_a_body_that_stalls_is_answered_408_and_closed_not_logged_as_500(
    relay: GuardedRelay,
) -> None:
    """A push whose body stops half way is closed after the body timeout with a 408; the
    relay logs it as a 408, no 500 and no error. The same push sent whole succeeds."""
    sealer = Sealer(new_vault_id("stall"))
    body = json.dumps({"blobs": [wire(sealer.blob("m", 1))]}).encode()
    answer = _answer_before_close(_stalled_push(relay, body))
    _assert_refused(answer, 408, "body_timeout", "a stalled body")
    with _client(relay) as http:
        assert push(http, sealer.vault_id, [sealer.blob("m", 1)]).status_code == 200
    deadline = time.monotonic() + EVENTUALLY_S
    while True:  # the app's side of the cut-short request is logged asynchronously
        pushes = [r for r in relay.log_records() if r.get("route") == "/v1/vaults/{vault_id}/push"]
        if any(r.get("status") == 408 for r in pushes) or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert [r.get("status") for r in pushes].count(408) >= 1, pushes
    records = relay.log_records()
    assert not [r for r in records if r.get("status") == 500 or r.get("level") == "error"]


def test_over_the_cap_with_every_connection_busy_a_new_one_is_refused_503(
    relay: GuardedRelay,
) -> None:
    """When all the cap's connections have a request in progress (bodies arriving), none
    can be closed to make room: a new connection gets a 503 JSON answer and is closed.
    Once the body timeout closed those, clients are served again."""
    sealer = Sealer(new_vault_id("busy"))
    body = json.dumps({"blobs": [wire(sealer.blob("m", 1))]}).encode()
    busy = [_stalled_push(relay, body) for _ in range(CAP)]
    try:
        deadline = time.monotonic() + EVENTUALLY_S
        while relay.held() < CAP and time.monotonic() < deadline:
            time.sleep(0.05)
        answer = _answer_before_close(socket.create_connection(("127.0.0.1", relay.port)))
        _assert_refused(answer, 503, "overloaded", "the connection over the cap")
        for sock in busy:  # the body timeout frees them
            assert _read_until_closed(sock, time.monotonic() + EVENTUALLY_S) is not None
    finally:
        for sock in busy:
            sock.close()
    with httpx.Client(base_url=relay.url, timeout=30) as http:
        assert http.get("/health").status_code == 200


def test_oversized_headers_are_refused_431(relay: GuardedRelay) -> None:
    """httptools buffers headers of any size; the guard refuses past MAX_HEADER_BYTES.
    Headers just under it are served."""
    filler = "x" * (MAX_HEADER_BYTES - 1024)
    with httpx.Client(base_url=relay.url, timeout=30) as http:
        assert http.get("/health", headers={"X-Filler": filler}).status_code == 200
    head = b"GET /health HTTP/1.1\r\nX-Filler: "
    # One byte over, then nothing: the relay has read all of it when it refuses, so it
    # closes with a FIN after its answer (no reset).
    answer = _answer_before_close(
        _half_open(relay.port, head + b"x" * (MAX_HEADER_BYTES + 1 - len(head)))
    )
    _assert_refused(answer, 431, "headers_too_large", "oversized headers")


def test_limits_from_the_environment_and_their_errors() -> None:
    assert limits_from_env({}) == ConnectionLimits(10.0, 30.0, 1000)
    env = {
        "ENGRAM_RELAY_HEADER_TIMEOUT_S": "2.5",
        "ENGRAM_RELAY_BODY_TIMEOUT_S": "7",
        "ENGRAM_RELAY_MAX_CONNECTIONS": "64",
    }
    assert limits_from_env(env) == ConnectionLimits(2.5, 7.0, 64)
    for name, value in [
        ("ENGRAM_RELAY_HEADER_TIMEOUT_S", "soon"),
        ("ENGRAM_RELAY_BODY_TIMEOUT_S", "0"),
        ("ENGRAM_RELAY_MAX_CONNECTIONS", "1.5"),
    ]:
        with pytest.raises(ValueError, match=name):
            limits_from_env({name: value})


def test_serve_refuses_a_bad_limit_in_one_line(tmp_path: Path) -> None:
    env = dict(os.environ, ENGRAM_RELAY_MAX_CONNECTIONS="0")
    result = subprocess.run(
        [str(BIN / "engram-relay"), "serve", "--port", "0", "--data-dir", str(tmp_path)],
        env=env, capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert result.returncode == 2
    assert "ENGRAM_RELAY_MAX_CONNECTIONS must be >= 1" in result.stderr
    assert "Traceback" not in result.stderr
    assert not (tmp_path / "postgres").exists()  # nothing started


def test_the_fd_limit_is_raised_to_fit_the_cap() -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    limits = ConnectionLimits(max_connections=2000)
    if hard != resource.RLIM_INFINITY and hard < 2000 + 256:
        pytest.skip(f"hard open-file limit {hard} is below the test's need")
    resource.setrlimit(resource.RLIMIT_NOFILE, (512, hard))
    try:
        assert ensure_fd_limit(limits) == 2000 + 256
        assert resource.getrlimit(resource.RLIMIT_NOFILE)[0] == 2000 + 256
        assert ensure_fd_limit(ConnectionLimits(max_connections=10)) == 2000 + 256  # never lowered
    finally:
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))
