"""A relay URL that does not answer fails within the connect timeout (issue 17, "Polish"):
ENGRAM_CONNECT_TIMEOUT bounds each connect and the retries of a client that has not reached
the relay yet; once it answered, a refused connection (a restart) gets the usual retries."""

from __future__ import annotations

import time

import httpx
import pytest

from engram_sync.client._errors import RelayUnavailableError
from engram_sync.client._http.relay_client import (
    CONNECT_TIMEOUT_ENV,
    DEFAULT_CONNECT_TIMEOUT_S,
    RelayClient,
    connect_timeout_from_env,
)
from tests.client.http.test_relay_client import VAULT, Script, Sleeps, scripted
from tests.relay.conftest import free_port


def test_a_client_that_never_reached_the_relay_waits_at_most_the_connect_timeout() -> None:
    sleeps = Sleeps()
    script = Script([httpx.ConnectError] * 10)
    with (
        scripted(script, sleeps, connect_timeout=1.5) as client,
        pytest.raises(RelayUnavailableError) as caught,
    ):
        client.stats(VAULT)
    assert sleeps.delays == [0.5, 1.0]  # 1.5 s in all; the backoff would wait 2, 4, 8 s more
    message = str(caught.value)
    assert message.startswith("the relay at http://relay.test could not be reached (Connect")
    assert "after 3 attempts within 1.5 s; check the relay URL and your network" in message
    assert "scheme, host and port, and that the relay runs there" in message
    assert f"{CONNECT_TIMEOUT_ENV}=SECONDS" in message


def test_once_the_relay_answered_a_refused_connection_is_retried_as_before() -> None:
    sleeps = Sleeps()
    script = Script([])  # the first answer: the relay is there
    with scripted(script, sleeps, connect_timeout=1.5) as client:
        client.stats(VAULT)
        script.steps = [httpx.ConnectError] * 10  # then it restarts
        with pytest.raises(RelayUnavailableError) as caught:
            client.stats(VAULT)
    assert sleeps.delays == [0.5, 1.0, 2.0, 4.0, 8.0]
    assert "could not be reached (ConnectError" in str(caught.value)
    assert "after 6 attempts; check" in str(caught.value)  # no connect budget
    assert CONNECT_TIMEOUT_ENV not in str(caught.value)


def test_a_connect_that_timed_out_is_not_tried_again_before_the_relay_answered() -> None:
    sleeps = Sleeps()
    script = Script([httpx.ConnectTimeout] * 10)  # a host that drops the packets
    with (
        scripted(script, sleeps, connect_timeout=3.0) as client,
        pytest.raises(RelayUnavailableError) as caught,
    ):
        client.stats(VAULT)
    assert len(script.requests) == 1  # one connect timeout is the whole budget
    assert sleeps.delays == []
    assert "after 1 attempts within 3 s" in str(caught.value)


def test_a_closed_port_fails_within_the_budget_with_real_sleeps() -> None:
    delays: list[float] = []

    def sleep(seconds: float) -> None:
        delays.append(seconds)
        time.sleep(seconds)

    url = f"http://127.0.0.1:{free_port()}"
    client = RelayClient(url, None, connect_timeout=0.5, backoff_base=10.0, sleep=sleep)
    with client, pytest.raises(RelayUnavailableError) as caught:
        client.health()
    assert sum(delays) <= 0.5  # the backoff alone would sleep up to 10 s before retry 1
    assert f"the relay at {url} could not be reached" in str(caught.value)
    assert "within 0.5 s" in str(caught.value)


def test_the_connect_timeout_comes_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(CONNECT_TIMEOUT_ENV, raising=False)
    assert connect_timeout_from_env() == DEFAULT_CONNECT_TIMEOUT_S == 5.0
    monkeypatch.setenv(CONNECT_TIMEOUT_ENV, "2.5")
    assert connect_timeout_from_env() == 2.5
    assert RelayClient("http://relay.test", None).connect_timeout == 2.5
    assert RelayClient("http://relay.test", None, timeout=1.0).connect_timeout == 1.0
    for bad in ("x", "0", "-1", "nan", "601"):
        monkeypatch.setenv(CONNECT_TIMEOUT_ENV, bad)
        with pytest.raises(ValueError, match=CONNECT_TIMEOUT_ENV):
            connect_timeout_from_env()
