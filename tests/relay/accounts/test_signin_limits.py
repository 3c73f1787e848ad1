"""Sign-in, pairing limits and password hashing under a flood (issue 14 item 7).

Real relays over real HTTP: `served` trusts no proxy (the default), `proxied` trusts
127.0.0.1 as its proxy hop (as compose trusts Caddy), so a client connecting from
127.0.0.1 plays the proxy and names the client in `X-Forwarded-For`; every other client
connects from its own loopback address (helpers.fresh_ip).
"""

from __future__ import annotations

import ipaddress
import itertools
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

import httpx
import pytest

from engram_sync.relay.http.routes.accounts import (
    REDEEM_PER_MINUTE,
    SIGNIN_PER_ACCOUNT_PER_MINUTE,
    SIGNIN_PER_MINUTE,
)
from engram_sync.relay.services import passwords
from tests.relay.accounts.helpers import PASSWORD, http, new_email, signin, signup
from tests.relay.conftest import Relay
from tests.relay.support import Sealer, assert_error, client, module_relay, new_vault_id, push_ok

PROXY = "127.0.0.1"
_documentation = itertools.count(1)


@pytest.fixture(scope="module")
def proxied(postgres_url: str) -> Iterator[Relay]:
    """A relay whose trusted proxy hop is 127.0.0.1."""
    trusted = (ipaddress.ip_network(PROXY),)
    with module_relay(postgres_url, trusted_proxies=trusted) as relay:
        yield relay


def public_ip() -> str:
    """A client address no other test of this module names (TEST-NET and beyond)."""
    n = next(_documentation)
    return f"198.{18 + n // 65536 % 2}.{n // 256 % 256}.{n % 256}"


def via_proxy(relay: Relay, email: str, password: str, forwarded_for: str) -> httpx.Response:
    """A sign-in the proxy hop (127.0.0.1) forwards for `forwarded_for`."""
    with http(relay, ip=PROXY) as proxy:
        return proxy.post(
            "/auth/signin",
            json={"email": email, "password": password},
            headers={"X-Forwarded-For": forwarded_for},
        )


def statuses(responses: list[httpx.Response]) -> list[int]:
    return [r.status_code for r in responses]


def until_limited(send: Callable[[int], httpx.Response], allowed: int) -> list[httpx.Response]:
    """Send until the first 429 (at most `allowed` + 20): a bucket starts full, so the
    first `allowed` answers are never limited; it refills meanwhile (30 a minute is one
    every 2 s), so how many more pass before the 429 depends on the machine's speed."""
    answers: list[httpx.Response] = []
    for n in range(allowed + 20):
        answers.append(send(n))
        if answers[-1].status_code == 429:
            break
    codes = statuses(answers)
    assert codes[0] != 429, codes
    assert codes[:allowed] == [codes[0]] * allowed, codes
    assert codes[-1] == 429, codes
    assert_error(answers[-1], 429, "rate_limited")
    assert int(answers[-1].headers["Retry-After"]) >= 1
    return answers


def test_a_wrong_password_flood_for_alice_never_limits_bob(proxied: Relay) -> None:
    """The issue's scenario behind a proxy: 30 wrong sign-ins for alice, then bob's
    correct one from another client. The flood is stopped per account, bob gets in."""
    alice, bob = signup(proxied), signup(proxied)
    attacker = public_ip()
    flood = [via_proxy(proxied, alice.email, "wrong password!", attacker) for _ in range(30)]
    codes = statuses(flood)
    # Limited per account long before the address's 30 (a refill every 6 s may let one by).
    assert codes[:SIGNIN_PER_ACCOUNT_PER_MINUTE] == [401] * SIGNIN_PER_ACCOUNT_PER_MINUTE
    assert set(codes) == {401, 429}, codes
    assert codes.count(401) < 20, codes
    assert via_proxy(proxied, bob.email, PASSWORD, public_ip()).status_code == 200
    with http(proxied) as direct:
        answer = direct.post("/auth/signin", json={"email": bob.email, "password": PASSWORD})
    assert answer.status_code == 200, answer.text


def test_the_email_limit_does_not_reveal_whether_an_account_exists(served: Relay) -> None:
    """An existing and an unknown email: the same number of 401s, then 429, from fresh
    addresses each time; the email counts normalised (case, spaces)."""
    existing = signup(served)
    unknown = new_email()
    for email in (existing.email, unknown):
        spellings = [email, email.upper(), f"  {email.lower()} "]

        def wrong(n: int, spellings: list[str] = spellings) -> httpx.Response:
            return signin(served, spellings[n % 3], "wrong password!")

        answers = until_limited(wrong, SIGNIN_PER_ACCOUNT_PER_MINUTE)
        assert_error(answers[0], 401, "invalid_credentials")
    assert signin(served, signup(served).email, PASSWORD).status_code == 200


def test_a_flood_from_one_address_is_limited_even_rotating_emails(served: Relay) -> None:
    with http(served) as one:
        answers = until_limited(
            lambda _: one.post(
                "/auth/signin", json={"email": new_email(), "password": "wrong password!"}
            ),
            SIGNIN_PER_MINUTE,
        )
    assert answers[0].status_code == 401
    assert signin(served, new_email(), "wrong password!").status_code == 401  # another address


def test_a_rotating_forwarded_for_from_an_untrusted_peer_changes_nothing(
    served: Relay, proxied: Relay
) -> None:
    """Not trusted, 127.0.0.1 is one client whatever it forwards (uvicorn's own proxy
    handling, which trusted 127.0.0.1, used to make each forwarded address a new client);
    from the trusted hop each forwarded address is a client of its own."""
    count = SIGNIN_PER_MINUTE + 1
    with http(served, ip=PROXY) as peer:
        until_limited(
            lambda _: peer.post(
                "/auth/signin",
                json={"email": new_email(), "password": "wrong password!"},
                headers={"X-Forwarded-For": public_ip()},
            ),
            SIGNIN_PER_MINUTE,
        )
    trusted = [
        via_proxy(proxied, new_email(), "wrong password!", public_ip()) for _ in range(count)
    ]
    assert statuses(trusted) == [401] * count


def test_only_the_hop_the_proxy_appended_counts(proxied: Relay) -> None:
    """What the client put left of the proxy's own entry is never believed."""
    client_ip = public_ip()
    until_limited(
        lambda _: via_proxy(proxied, new_email(), "wrong password!", f"{public_ip()}, {client_ip}"),
        SIGNIN_PER_MINUTE,
    )
    assert via_proxy(proxied, new_email(), "wrong password!", public_ip()).status_code == 401


def test_ipv6_clients_count_per_64(proxied: Relay) -> None:
    until_limited(
        lambda n: via_proxy(proxied, new_email(), "wrong password!", f"2001:db8:7:7::{n + 1:x}"),
        SIGNIN_PER_MINUTE,
    )
    other = via_proxy(proxied, new_email(), "wrong password!", "2001:db8:7:8::1")
    assert other.status_code == 401


def test_pairing_redemption_is_limited_per_real_client(served: Relay, proxied: Relay) -> None:
    body = {"code": "ENG-AAAA-BBBB-CCCC", "device_id": "dev-1"}
    with http(served, ip=PROXY) as peer:
        spoofing = until_limited(
            lambda _: peer.post(
                "/pair/redeem", json=body, headers={"X-Forwarded-For": public_ip()}
            ),
            REDEEM_PER_MINUTE,
        )
    assert spoofing[0].status_code == 410
    with http(proxied, ip=PROXY) as proxy:
        forwarded = [
            proxy.post("/pair/redeem", json=body, headers={"X-Forwarded-For": public_ip()})
            for _ in range(REDEEM_PER_MINUTE + 1)
        ]
    assert statuses(forwarded) == [410] * (REDEEM_PER_MINUTE + 1)


def _hold_the_hashing_pool(release: threading.Event) -> threading.Thread:
    """Fill every worker and every waiting place of the hashing pool until `release`."""
    import asyncio

    capacity = passwords.MAX_CONCURRENT_HASHES + passwords.MAX_WAITING_HASHES

    async def hold() -> None:
        await asyncio.gather(*(passwords.run_in_pool(release.wait) for _ in range(capacity)))

    holder = threading.Thread(target=asyncio.run, args=(hold(),), daemon=True)
    holder.start()
    deadline = time.monotonic() + 30
    while passwords.hash_stats().admitted < capacity:
        assert time.monotonic() < deadline, "the holder never filled the pool"
        time.sleep(0.01)
    return holder


def test_a_full_hashing_queue_answers_busy_at_once(served: Relay) -> None:
    account = signup(served)
    release = threading.Event()
    holder = _hold_the_hashing_pool(release)
    try:
        busy = signin(served, account.email, PASSWORD)
        with http(served) as other:
            new = other.post("/auth/signup", json={"email": new_email(), "password": PASSWORD})
    finally:
        release.set()
        holder.join(timeout=30)
    body = assert_error(busy, 503, "busy")
    assert "retry" in body["error"]
    assert busy.headers["Retry-After"] == "1"
    assert_error(new, 503, "busy")
    assert signin(served, account.email, PASSWORD).status_code == 200  # room again


def test_a_signin_flood_never_hashes_past_the_cap_and_sync_goes_on(proxied: Relay) -> None:
    """60 concurrent wrong sign-ins (each its own client and email, so no limit stops
    them) while a device pulls: every pull answers, no more hashes ever run than the cap
    nor wait than the queue, and what does not fit is told `busy` (never a 500)."""
    vault = new_vault_id()
    sealer = Sealer(vault)
    with client(proxied) as device:
        push_ok(device, vault, [sealer.blob(f"m{i}", 1) for i in range(50)])
        passwords.reset_peak()
        with ThreadPoolExecutor(60) as pool:
            flood = [
                pool.submit(via_proxy, proxied, new_email(), "wrong password!", public_ip())
                for _ in range(60)
            ]
            pulls: list[tuple[int, int]] = []
            while not all(f.done() for f in flood) or not pulls:
                response = device.get(f"/v1/vaults/{vault}/pull", params={"cursor": 0})
                pulls.append((response.status_code, len(response.json()["blobs"])))
    answers = Counter(f.result().status_code for f in flood)
    assert set(pulls) == {(200, 50)}
    assert set(answers) <= {401, 503}, answers
    assert answers[401] >= 1
    stats = passwords.hash_stats()
    assert 1 <= stats.peak_running <= passwords.MAX_CONCURRENT_HASHES
    assert stats.peak_admitted <= passwords.MAX_CONCURRENT_HASHES + passwords.MAX_WAITING_HASHES
    assert stats.refused == answers[503]
    assert stats.admitted == stats.running == 0
