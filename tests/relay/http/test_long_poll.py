"""The long-poll fallback of the live change feed, `pull?cursor=N&wait=S` (PROTOCOL §15),
over real HTTP on a real relay and PostgreSQL."""

from __future__ import annotations

import threading
from typing import Any

import httpx
import pytest

from tests.relay.conftest import Relay
from tests.relay.support import (
    Sealer,
    assert_error,
    client,
    module_relay_fixture,
    new_device_id,
    new_vault_id,
    pull,
    pull_ok,
    push_ok,
    wait_for,
)

relay = module_relay_fixture()


def test_a_held_pull_answers_when_a_push_commits(relay: Relay, http: httpx.Client) -> None:
    vault, device = new_vault_id(), new_device_id()
    sealer = Sealer(vault)
    head = push_ok(http, vault, sealer.blobs(2))["cursor"]
    answer: dict[str, Any] = {}

    def held() -> None:
        with client(relay) as c:
            c.headers["X-Engram-Device"] = device
            answer.update(pull_ok(c, vault, cursor=head, wait=60))

    thread = threading.Thread(target=held)
    thread.start()
    # The held pull has read its first (empty) page once the relay recorded the device's
    # progress for it: the push below comes after it, so only a wake-up can answer it.
    wait_for(
        lambda: bool(relay.sql("SELECT 1 FROM devices WHERE device_id = $1", device)),
        "the held pull's first page",
    )
    pushed = push_ok(http, vault, [sealer.blob("new", 1)])["cursor"]
    thread.join(timeout=50)  # far below the 60 s it would hold without the wake-up
    assert not thread.is_alive(), "the held pull did not answer after the push"
    assert [b["memory_id"] for b in answer["blobs"]] == ["new"]
    assert answer["cursor"] == pushed == head + 1
    assert answer["has_more"] is False


def test_a_held_pull_with_nothing_new_answers_empty_after_wait(
    relay: Relay, http: httpx.Client
) -> None:
    vault = new_vault_id()
    head = push_ok(http, vault, Sealer(vault).blobs(2))["cursor"]
    page = pull_ok(http, vault, cursor=head, wait=0.3)
    assert page["blobs"] == []
    assert page["cursor"] == head
    assert page["has_more"] is False
    # A vault nobody pushed to waits the same way and answers its empty page.
    assert pull_ok(http, new_vault_id(), cursor=0, wait=0.3)["blobs"] == []


def test_a_pull_with_news_answers_at_once_whatever_wait(relay: Relay, http: httpx.Client) -> None:
    vault = new_vault_id()
    push_ok(http, vault, Sealer(vault).blobs(3))
    page = pull_ok(http, vault, cursor=1, wait=60)  # 60 is allowed, and not waited for
    assert [b["seq"] for b in page["blobs"]] == [2, 3]
    assert page["cursor"] == 3


@pytest.mark.parametrize("wait", ["0", "-1", "60.5", "61", "abc", "nan"])
def test_a_bad_wait_is_400_naming_it(http: httpx.Client, wait: str) -> None:
    response = pull(http, new_vault_id(), cursor=0, wait=wait)
    body = assert_error(response, 400, "invalid_request")
    assert body["field"] == "wait", body


def test_wait_needs_the_cursor_form(http: httpx.Client) -> None:
    body = assert_error(pull(http, new_vault_id(), wait=1), 400, "invalid_request")
    assert body["field"] == "wait", body
    assert "cursor" in body["error"]


def test_a_device_revoked_while_held_is_refused(relay: Relay, http: httpx.Client) -> None:
    vault, device = new_vault_id(), new_device_id()
    key = relay.mint(vault, device_id=device)
    answer: list[httpx.Response] = []

    def held() -> None:
        with client(relay, key) as c:
            answer.append(pull(c, vault, cursor=0, wait=60))

    thread = threading.Thread(target=held)
    thread.start()
    wait_for(
        lambda: bool(relay.sql("SELECT 1 FROM devices WHERE device_id = $1", device)),
        "the held pull's first page",
    )
    assert http.delete(f"/v1/vaults/{vault}/devices/{device}").status_code == 200
    thread.join(timeout=50)
    assert not thread.is_alive(), "the held pull was not woken by the revocation"
    assert_error(answer[0], 403, "device_revoked")
