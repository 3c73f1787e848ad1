"""Slowloris against the relay: half-open connections vs. a normal client (issue 14 item 6).

`python -m bench.slowloris [--connections 5000] [--seconds 30] [--attackers 1] [--unguarded]`:
one relay
process (served like `engram-relay serve`, default limits unless the environment sets
them) on a new database. A normal client's latency is measured idle, then while an
attacker keeps `--connections` connections open that each sent half a request
(re-opening every one the relay closes) for `--seconds`, split over `--attackers`
processes (one process holds at most its open-file limit). Prints the relay's peak of
connections held and of open descriptors, how the attacker's connections ended (closed
silently, 408, 503, reset) and after how long, and the normal client's latencies and
failures. `--unguarded` sets the header timeout and the cap out of reach (10^6), which
is what uvicorn alone did: the baseline the guards are measured against.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import multiprocessing
import os
import resource
import secrets
import selectors
import socket
import statistics
import threading
import time
from collections import Counter, defaultdict
from typing import Any, Final

import httpx
import psutil

from bench.relay_load import headers
from bench.relay_process import RelayProcess, scratch_relay
from bench.stats import latency_summary
from engram_sync.relay.serving.connections import ENV_HEADER_TIMEOUT, ENV_MAX_CONNECTIONS

HALF_REQUEST: Final = b"GET /health HTTP/1.1\r\nHost: relay\r\nUser-Agent: slow"
IDLE_REQUESTS: Final = 100
OUT_OF_REACH: Final = "1000000"


def _ending(data: bytes | None) -> str:
    if data is None:
        return "reset"
    if not data:
        return "closed_silently"
    return data.split(b"\r\n", 1)[0].decode(errors="replace").removeprefix("HTTP/1.1 ")[:3]


def _attack(port: int, target: int, seconds: float, go: Any, results: Any) -> None:
    """Child process: keep `target` half-open connections for `seconds` after `go`."""
    hard = resource.getrlimit(resource.RLIMIT_NOFILE)[1]
    resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
    sel = selectors.DefaultSelector()
    opened_at: dict[socket.socket, float] = {}
    endings: Counter[str] = Counter()
    lifetimes: dict[str, list[float]] = defaultdict(list)
    failed = 0
    peak_open = 0
    go.wait()
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        while len(opened_at) < target and time.monotonic() < end:
            sock = socket.socket()
            sock.settimeout(5)
            try:
                sock.connect(("127.0.0.1", port))
                sock.sendall(HALF_REQUEST)
            except OSError:
                failed += 1
                sock.close()
                break
            sock.setblocking(False)
            sel.register(sock, selectors.EVENT_READ)
            opened_at[sock] = time.monotonic()
            if len(opened_at) % 200 == 0:
                break  # look at what closed now and then, also while opening
        peak_open = max(peak_open, len(opened_at))
        for key, _ in sel.select(timeout=0.05):
            sock = key.fileobj  # type: ignore[assignment]
            try:
                data: bytes | None = sock.recv(65536)
            except BlockingIOError:
                continue
            except OSError:
                data = None
            kind = _ending(data)
            endings[kind] += 1
            lifetimes[kind].append(time.monotonic() - opened_at.pop(sock))
            sel.unregister(sock)
            sock.close()
    still_open = len(opened_at)
    for sock in opened_at:
        sock.close()
    results.put(
        {
            "opened": sum(endings.values()) + still_open,
            "connect_failures": failed,
            "attacker_peak_open": peak_open,
            "still_open_at_end": still_open,
            "endings": dict(endings),
            "lifetime_s": {
                kind: {
                    "median": round(statistics.median(values), 2),
                    "max": round(max(values), 2),
                }
                for kind, values in lifetimes.items()
            },
        }
    )


def _timed(client: httpx.Client, path: str) -> float | str:
    started = time.perf_counter()
    try:
        response = client.get(path, params={"cursor": 0} if "pull" in path else None)
    except httpx.HTTPError as exc:
        return type(exc).__name__
    if response.status_code != 200:
        return str(response.status_code)
    return (time.perf_counter() - started) * 1000


def _normal_client(url: str, key: str, vault_id: str, count: int | None, stop: Any) -> Any:
    """Health and pull requests, each on a new connection (each must get past the cap);
    `count` pairs, or until `stop` is set."""
    latencies: list[float] = []
    failures: Counter[str] = Counter()
    hdrs = headers(key, "bench-normal") | {"Connection": "close"}
    with httpx.Client(base_url=url, headers=hdrs, timeout=30) as client:
        done = 0
        while (count is None and not stop.is_set()) or (count is not None and done < count):
            for path in ("/health", f"/v1/vaults/{vault_id}/pull"):
                result = _timed(client, path)
                if isinstance(result, float):
                    latencies.append(result)
                else:
                    failures[result] += 1
            done += 1
    return latencies, failures


def _merged(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The attacker processes' results as one (lifetimes: the worst median and max)."""
    merged: dict[str, Any] = {"processes": len(parts)}
    for name in ("opened", "connect_failures", "attacker_peak_open", "still_open_at_end"):
        merged[name] = sum(part[name] for part in parts)
    endings: Counter[str] = Counter()
    lifetimes: dict[str, dict[str, float]] = {}
    for part in parts:
        endings.update(part["endings"])
        for kind, values in part["lifetime_s"].items():
            seen = lifetimes.setdefault(kind, {"median": 0.0, "max": 0.0})
            seen["median"] = max(seen["median"], values["median"])
            seen["max"] = max(seen["max"], values["max"])
    merged["endings"] = dict(endings)
    merged["lifetime_s"] = lifetimes
    return merged


def _monitor(pid: int, port: int, stop: threading.Event, peaks: dict[str, int]) -> None:
    proc = psutil.Process(pid)
    while not stop.is_set():
        with contextlib.suppress(psutil.Error):
            conns = proc.net_connections("tcp")
            held = sum(1 for c in conns if c.laddr.port == port and c.raddr)
            peaks["held"] = max(peaks.get("held", 0), held)
            peaks["fds"] = max(peaks.get("fds", 0), proc.num_fds())
        time.sleep(0.25)


def _measure(
    relay: RelayProcess, key: str, vault_id: str, target: int, seconds: float, processes: int
) -> Any:
    idle, idle_failures = _normal_client(relay.url, key, vault_id, IDLE_REQUESTS, None)
    context = multiprocessing.get_context("spawn")
    go, results = context.Event(), context.Queue()
    share = -(-target // processes)
    attackers = [
        context.Process(target=_attack, args=(relay.port, share, seconds, go, results))
        for _ in range(processes)
    ]
    for attacker in attackers:
        attacker.start()
    peaks: dict[str, int] = {}
    stop = threading.Event()
    monitor = threading.Thread(target=_monitor, args=(relay.pid, relay.port, stop, peaks))
    try:
        time.sleep(2.0)  # the attacker's interpreter has started
        monitor.start()
        go.set()
        time.sleep(min(5.0, seconds / 3))  # the attack is on in earnest
        done = threading.Event()

        def wait_for_attackers() -> None:
            for attacker in attackers:
                attacker.join()
            done.set()

        threading.Thread(target=wait_for_attackers).start()
        during, failures = _normal_client(relay.url, key, vault_id, None, done)
        attack = _merged([results.get(timeout=120) for _ in attackers])
    finally:
        stop.set()
        for attacker in attackers:
            attacker.join(timeout=60)
            if attacker.is_alive():
                attacker.kill()
    return {
        "relay_peak_connections_held": peaks.get("held"),
        "relay_peak_open_fds": peaks.get("fds"),
        "attack": attack,
        "normal_idle_ms": latency_summary(idle, 99),
        "normal_idle_failures": dict(idle_failures),
        "normal_during_attack_ms": latency_summary(during, 99),
        "normal_during_attack_failures": dict(failures),
    }


def run(target: int, seconds: float, *, processes: int = 1, unguarded: bool) -> dict[str, Any]:
    """Database, relay, a vault of one blob, the measurement; everything stopped after."""
    if unguarded:
        os.environ[ENV_HEADER_TIMEOUT] = OUT_OF_REACH
        os.environ[ENV_MAX_CONNECTIONS] = OUT_OF_REACH
    key = "bench-" + secrets.token_hex(16)
    vault_id = "bench-slow-" + secrets.token_hex(4)
    with scratch_relay(key) as relay:
        with httpx.Client(base_url=relay.url, headers=headers(key, "bench-pusher")) as client:
            assert client.get(f"/v1/vaults/{vault_id}/pull", params={"cursor": 0}).is_success
        result = _measure(relay, key, vault_id, target, seconds, processes)
    limits = {k: os.environ.get(k, "default") for k in (ENV_HEADER_TIMEOUT, ENV_MAX_CONNECTIONS)}
    return {"connections": target, "seconds": seconds, "limits": limits, **result,
            "cpus": os.cpu_count()}  # fmt: skip


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0] if __doc__ else None)
    parser.add_argument("--connections", type=int, default=5000, help="half-open connections")
    parser.add_argument("--seconds", type=float, default=30.0, help="how long the attack lasts")
    parser.add_argument("--attackers", type=int, default=1, help="attacker processes")
    parser.add_argument("--unguarded", action="store_true", help="timeouts and cap out of reach")
    args = parser.parse_args()
    result = run(args.connections, args.seconds, processes=args.attackers, unguarded=args.unguarded)
    print(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
