"""The relay's JSON logs as an operator sees them on a terminal (issue 17, "Polish"): one
plain JSON object per line, no ANSI escapes (uvicorn's `color_message`), and a
`request_id` only on the lines written while serving a request; what `serve` prints on
stdout for a person has no styling with the json format."""

from __future__ import annotations

import json
import logging
import os
import pty
import subprocess
import sys
from pathlib import Path
from typing import Any

import httpx

from engram_sync.relay.serving.logs import JsonFormatter
from engram_sync.relay.serving.request_context import RequestIdFilter, request_id_var
from tests.relay.conftest import ADMIN_KEY, free_port
from tests.relay.support import wait_for
from tests.terminal import read_until_closed

BIN = Path(sys.executable).parent


def _record(msg: str, **extra: Any) -> logging.LogRecord:
    record = logging.LogRecord("uvicorn.error", logging.INFO, __file__, 1, msg, (), None)
    for key, value in extra.items():
        setattr(record, key, value)
    RequestIdFilter().filter(record)
    return record


def test_the_formatter_drops_colours_and_the_request_id_outside_a_request() -> None:
    formatter = JsonFormatter()
    started = json.loads(
        formatter.format(
            _record(
                "Uvicorn running on http://x", color_message="Uvicorn running on \x1b[1mx\x1b[0m"
            )
        )
    )
    assert started["msg"] == "Uvicorn running on http://x"
    assert "color_message" not in started
    assert "request_id" not in started  # outside a request: no field at all, not "None"
    token = request_id_var.set("trace-1")
    try:
        served = json.loads(formatter.format(_record("served", route="/health", nothing=None)))
    finally:
        request_id_var.reset(token)
    assert served["request_id"] == "trace-1"  # the positive case: inside a request
    assert served["route"] == "/health"
    assert served["nothing"] is None  # JSON null, not the text "None"
    coloured = json.loads(formatter.format(_record("\x1b[32mgreen\x1b[0m text")))
    assert coloured["msg"] == "green text"


def _drain(master: int) -> bytes:
    """Everything written to a pseudo-terminal whose other end has closed."""
    seen = read_until_closed(master)
    os.close(master)
    return seen


def test_serve_on_a_terminal_writes_plain_json_lines(fresh_database_url: str) -> None:
    port = free_port()
    master, replica = pty.openpty()  # stderr: the log
    shown, shown_replica = pty.openpty()  # stdout: what a person reads
    env = dict(os.environ, SYNC_API_KEYS=f"{ADMIN_KEY}:1000")
    proc = subprocess.Popen(
        [str(BIN / "engram-relay"), "serve", "--port", str(port), "--database-url",
         fresh_database_url, "--log-level", "info", "--log-format", "json"],
        env=env, stdout=shown_replica, stderr=replica,
    )  # fmt: skip
    os.close(replica)
    os.close(shown_replica)
    try:

        def ready() -> bool:
            try:
                return httpx.get(f"http://127.0.0.1:{port}/ready", timeout=1).status_code == 200
            except httpx.TransportError:
                return False

        wait_for(ready, "the relay to start", every=0.2)
        answer = httpx.get(
            f"http://127.0.0.1:{port}/v1/vaults/logs/stats",
            headers={"Authorization": f"Bearer {ADMIN_KEY}", "X-Request-ID": "trace-42"},
        )
        assert answer.status_code == 200
    finally:
        proc.terminate()
        proc.wait(timeout=60)
    printed = _drain(shown).decode("utf-8")
    assert printed == f"Engram Sync relay listening on http://127.0.0.1:{port}\r\n"  # plain
    text = _drain(master).decode("utf-8")
    assert "\x1b" not in text
    assert "\\u001b" not in text  # no escape inside the JSON either
    lines = [json.loads(line) for line in text.splitlines() if line.strip()]
    assert len(lines) >= 3
    assert not [line for line in lines if line.get("request_id") in ("None", None)
                and "request_id" in line]  # fmt: skip
    outside = [line for line in lines if "request_id" not in line]
    assert [line["url"] for line in outside if line["msg"] == "relay listening"] == [
        f"http://127.0.0.1:{port}"
    ]  # the relay's own line is a JSON line too
    assert any(line["msg"].startswith("Started server process") for line in outside), lines
    assert any(line.get("request_id") == "trace-42" for line in lines), lines  # inside one
