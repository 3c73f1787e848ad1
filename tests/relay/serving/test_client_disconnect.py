"""A client that leaves in the middle of its request body (issue 14 item 11).

It used to be logged as an internal error with a traceback and counted as a 500. Now
it is an info line without a traceback, and no 500 is counted. A real relay over real
HTTP; the client is a raw socket that announces `Content-Length: N`, sends half of
the body and closes.
"""

from __future__ import annotations

import json
import logging
import re
import socket
import time

import pytest

from tests.relay.conftest import ADMIN_KEY, Relay
from tests.relay.support import Sealer, client, module_relay_fixture, new_vault_id, push, wire

PUSH_ROUTE = "/v1/vaults/{vault_id}/push"
# One sample a line; the route label itself holds braces ({vault_id}).
_SAMPLE = re.compile(r"^engram_relay_requests_total\{(.*)\} (\S+)$", re.MULTILINE)


relay = module_relay_fixture()


def push_counts(relay: Relay) -> dict[str, float]:
    """Status -> requests counted on the push route."""
    counts: dict[str, float] = {}
    for labels, value in _SAMPLE.findall(relay.scrape()):
        fields = dict(re.findall(r'(\w+)="([^"]*)"', labels))
        if fields.get("route") == PUSH_ROUTE and fields.get("method") == "POST":
            counts[fields["status"]] = counts.get(fields["status"], 0) + float(value)
    return counts


def wait_for_more(relay: Relay, before: float) -> dict[str, float]:
    """The push counts once one more push request has been counted (bounded wait for an
    event, not a timing assertion)."""
    for _ in range(400):
        counts = push_counts(relay)
        if sum(counts.values()) > before:
            return counts
        time.sleep(0.05)
    raise AssertionError("the relay never counted the request")


def half_a_push(relay: Relay, vault: str) -> None:
    """POST a push announcing its whole length, send half the body, then close."""
    body = json.dumps({"blobs": [wire(b) for b in Sealer(vault).blobs(20)]}).encode()
    host, port = relay.url.removeprefix("http://").split(":")
    head = (
        f"POST /v1/vaults/{vault}/push HTTP/1.1\r\nHost: {host}:{port}\r\n"
        f"Authorization: Bearer {ADMIN_KEY}\r\nContent-Type: application/json\r\n"
        f"Content-Length: {len(body)}\r\n\r\n"
    ).encode()
    with socket.create_connection((host, int(port)), timeout=30) as sock:
        sock.sendall(head + body[: len(body) // 2])
        time.sleep(0.2)  # let the relay start reading the body (not an assertion)
        sock.shutdown(socket.SHUT_RDWR)


def test_a_client_leaving_mid_body_is_no_500_and_no_traceback(
    relay: Relay, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO)
    before = push_counts(relay)
    half_a_push(relay, new_vault_id())
    after = wait_for_more(relay, sum(before.values()))
    new = {status: after[status] - before.get(status, 0) for status in after}
    new = {status: n for status, n in new.items() if n}
    assert new.get("500", 0) == 0, new
    assert sum(new.values()) == 1, new
    (status,) = new
    assert status.startswith("4"), new  # counted as the client's doing

    relay_records = [r for r in caplog.records if r.name.startswith("engram_sync.relay")]
    assert not [r for r in relay_records if r.levelno >= logging.ERROR], [
        r.getMessage() for r in relay_records
    ]
    assert not [r for r in relay_records if r.exc_info], "a traceback was logged"
    said = [r for r in relay_records if r.name == "engram_sync.relay.http.errors"]
    assert said, [r.getMessage() for r in relay_records]
    assert all(r.levelno in (logging.INFO, logging.WARNING) for r in said)
    assert any("client disconnected" in r.getMessage() for r in said)


def test_a_whole_push_next_to_it_is_counted_as_it_was_answered(relay: Relay) -> None:
    vault = new_vault_id()
    before = push_counts(relay)
    with client(relay) as http:
        assert push(http, vault, Sealer(vault).blobs(20)).status_code == 200
        bad = http.post(
            f"/v1/vaults/{vault}/push",
            content=b'{"blobs": [',
            headers={"Content-Type": "application/json"},
        )
        assert bad.status_code == 400
    after = push_counts(relay)
    assert after.get("200", 0) - before.get("200", 0) == 1
    assert after.get("400", 0) - before.get("400", 0) == 1
    assert after.get("500", 0) == before.get("500", 0)
