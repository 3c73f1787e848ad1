"""A flood of bad keys against a real relay (issue 36, relay.domain.key_gate): the database
is asked about keys at most a bounded number of times, and honest keys are still served.

Counted by the relay's own counter of minted-key lookups (`engram_relay_key_lookups`,
incremented next to the one query, relay.http.auth), scraped from /metrics.
"""

from __future__ import annotations

import re
import secrets
import time
from collections.abc import Iterator

import pytest

from engram_sync.relay.domain.key_gate import FAILED_LOOKUPS_PER_S
from tests.relay.conftest import Relay
from tests.relay.support import assert_error, client, module_relay, new_vault_id

FLOOD = 300


@pytest.fixture(scope="module")
def relay(postgres_url: str) -> Iterator[Relay]:
    with module_relay(postgres_url) as served:
        yield served


def lookups(relay: Relay) -> float:
    found = re.search(r"^engram_relay_key_lookups_total (\S+)$", relay.scrape(), re.M)
    assert found, "no engram_relay_key_lookups_total in /metrics"
    return float(found[1])


def pull(relay: Relay, vault: str, key: str) -> int:
    with client(relay, key) as http:
        return http.get(f"/v1/vaults/{vault}/pull", params={"cursor": 0}).status_code


def test_a_flood_of_bad_keys_costs_a_bounded_number_of_lookups(relay: Relay) -> None:
    vault = new_vault_id("flood")
    honest = relay.mint(vault)
    assert pull(relay, vault, honest) == 200  # looked up once: known good from now on
    before = lookups(relay)
    started = time.monotonic()
    statuses: set[int] = set()
    with client(relay, None) as http:
        for _ in range(FLOOD):
            bad = "esk_" + secrets.token_urlsafe(24)
            answer = http.get(f"/v1/vaults/{vault}/pull", params={"cursor": 0},
                              headers={"Authorization": f"Bearer {bad}"})  # fmt: skip
            statuses.add(answer.status_code)
    elapsed = time.monotonic() - started
    looked_up = lookups(relay) - before
    assert statuses == {401, 429}, statuses
    # the burst, then at most two lookups a refilled token (relay.domain.key_gate)
    assert looked_up <= FAILED_LOOKUPS_PER_S * (1 + 2 * elapsed) + 1, (looked_up, elapsed)
    assert looked_up < FLOOD / 2
    # the honest key from the same address, right after: served, and still looked up
    assert pull(relay, vault, honest) == 200
    assert lookups(relay) - before == looked_up + 1


def test_one_bad_key_again_and_again_is_looked_up_once(relay: Relay) -> None:
    vault = new_vault_id("again")
    bad = "esk_" + secrets.token_urlsafe(24)
    before = lookups(relay)
    with client(relay, bad) as http:
        for _ in range(50):
            assert_error(http.get(f"/v1/vaults/{vault}/pull", params={"cursor": 0}), 401)
    assert lookups(relay) - before == 1


def test_a_key_past_its_rate_is_refused_without_lookups(relay: Relay) -> None:
    vault = new_vault_id("rate")
    key = relay.mint(vault, rate=2)
    before = lookups(relay)
    with client(relay, key) as http:
        codes = [http.get(f"/v1/vaults/{vault}/pull", params={"cursor": 0}).status_code
                 for _ in range(40)]  # fmt: skip
    assert codes[:2] == [200, 200]
    assert set(codes[2:]) <= {200, 429}
    assert 429 in codes
    # each 200 and the first 429 of each wait were looked up; the other 429s were not
    assert lookups(relay) - before <= 2 * codes.count(200) + 1 < 40
