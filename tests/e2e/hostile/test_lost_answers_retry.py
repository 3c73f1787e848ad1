"""Lost answers and the per-call retry policy (issue 19 "Retries", docs/retries.md), against
the real relay behind the lying proxy: the proxy forwards the request (the relay acts on it)
and then holds the answer past the client's timeout, or answers 503 without forwarding.

A key mint or sign-up whose answer is lost is sent again under the same Idempotency-Key
and the relay answers what the first attempt made (one key, one account); against a relay
that does not list `idempotency-keys` (the proxy strips it, as an older relay) it is not
sent again, and the error says it may have happened. A push whose answer is lost is sent
again and lands once (PROTOCOL §6); a mint refused with 503 `busy` before the relay saw it
is retried either way.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterator

import pytest

from engram_sync.client._errors import OutcomeUnknownError
from engram_sync.client._http.account_client import AccountClient
from engram_sync.client._http.relay_client import RelayClient
from tests.e2e.helpers import add, contents
from tests.e2e.hostile.conftest import Scene
from tests.e2e.hostile.proxy import Answer, Exchange
from tests.e2e.test_account_cli import EMAIL, Device

TIMEOUT_S = 2.0
# The proxy holds a lost answer this long: past the client's read timeout, so the client
# sees a ReadTimeout after the relay has acted. Not a timed assertion: only the order
# matters (the relay answered the proxy before the client gave up).
HOLD_S = 3 * TIMEOUT_S
KEYS = r"/account/keys$"
# What the relay answers when its database fails; forwarded first, so the relay did act.
UNAVAILABLE = Answer(
    503,
    {"error": "the relay's database is unavailable; retry shortly", "code": "unavailable"},
    headers={"content-type": "application/json", "Retry-After": "0"},
)


def _lose(exchange: Exchange) -> Answer:
    """The relay's own answer, held until the client has given up on it."""
    return Answer(exchange.status, exchange.body, headers=exchange.headers, delay=HOLD_S)


def _as_an_older_relay(scene: Scene) -> None:
    """/v1/info without `idempotency-keys`: the client must not count on the header."""

    def old_info(exchange: Exchange) -> Answer:
        body = exchange.json()
        body["features"] = [f for f in body["features"] if f != "idempotency-keys"]
        return Answer(200, body)

    scene.proxy.on("GET", r"^/v1/info$", old_info)


def _keys(scene: Scene, vault_id: str) -> int:
    (row,) = scene.relay.sql("SELECT count(*) AS n FROM api_keys WHERE vault_id = $1", vault_id)
    return int(row["n"])


@pytest.fixture
def account(scene: Scene) -> Iterator[AccountClient]:
    """A signed-up account (directly at the relay) whose session talks through the proxy."""
    email = f"retry-{secrets.token_hex(4)}@example.com"
    with AccountClient(scene.relay.url, None) as direct:
        created = direct.signup(email, secrets.token_urlsafe(32))
    with AccountClient(
        scene.proxy.url, created.session_token, timeout=TIMEOUT_S, backoff_base=0.01
    ) as client:
        yield client


def test_a_lost_mint_answer_is_retried_and_answers_the_first_key(
    scene: Scene, account: AccountClient
) -> None:
    rule = scene.proxy.on("POST", KEYS, _lose, times=1)
    minted = account.mint_key(scene.vault_id, device_id="dev-a", label="a")
    assert rule.hits == 1
    sent = scene.proxy.requests("POST", KEYS)
    assert len(sent) == 2  # the lost one, and its retry
    assert _keys(scene, scene.vault_id) == 1  # minted once; the retry got that key
    (row,) = scene.relay.sql("SELECT id FROM api_keys WHERE vault_id = $1", scene.vault_id)
    assert minted.id == row["id"]
    # The positive case next to it: a new call is a new request and mints one more.
    assert account.mint_key(scene.vault_id, device_id="dev-a", label="a").id != minted.id
    assert _keys(scene, scene.vault_id) == 2


def test_a_lost_mint_answer_from_an_older_relay_mints_no_second_key(
    scene: Scene, account: AccountClient
) -> None:
    _as_an_older_relay(scene)
    rule = scene.proxy.on("POST", KEYS, _lose, times=1)
    with pytest.raises(OutcomeUnknownError, match="a key may have been minted"):
        account.mint_key(scene.vault_id, device_id="dev-a", label="a")
    assert rule.hits == 1
    assert len(scene.proxy.requests("POST", KEYS)) == 1  # not sent again
    assert _keys(scene, scene.vault_id) == 1  # the relay did mint it, once


def test_a_mint_refused_with_503_busy_before_processing_is_retried(
    scene: Scene, account: AccountClient
) -> None:
    busy = Answer(
        503,
        {"error": "the relay is checking too many passwords at once", "code": "busy"},
        headers={"content-type": "application/json", "Retry-After": "0"},
    )
    scene.proxy.on("POST", KEYS, lambda e: busy, forward=False, times=2)
    minted = account.mint_key(scene.vault_id, device_id="dev-b", label="b")
    assert len(scene.proxy.requests("POST", KEYS)) == 3  # two refusals, then the relay
    assert minted.key
    assert _keys(scene, scene.vault_id) == 1


def test_a_mint_answered_503_unavailable_after_the_relay_acted_is_retried_once_made(
    scene: Scene, account: AccountClient
) -> None:
    """`unavailable` may follow a commit: the retry under the same key answers that key."""
    scene.proxy.on("POST", KEYS, lambda e: UNAVAILABLE, times=1)  # forwarded: it minted
    minted = account.mint_key(scene.vault_id, device_id="dev-c", label="c")
    assert len(scene.proxy.requests("POST", KEYS)) == 2
    assert _keys(scene, scene.vault_id) == 1
    assert minted.key


def test_an_older_relay_answering_503_unavailable_after_acting_is_not_retried(
    scene: Scene, account: AccountClient
) -> None:
    """The exclusion next to the retried 503: without idempotency keys it may have minted."""
    _as_an_older_relay(scene)
    scene.proxy.on("POST", KEYS, lambda e: UNAVAILABLE, times=1)  # forwarded: it minted
    with pytest.raises(OutcomeUnknownError, match="HTTP 503"):
        account.mint_key(scene.vault_id, device_id="dev-c", label="c")
    assert len(scene.proxy.requests("POST", KEYS)) == 1
    assert _keys(scene, scene.vault_id) == 1


def test_a_signup_whose_answer_was_lost_is_retried_into_one_account(scene: Scene) -> None:
    handle = scene.blank_device("solo", "solo passphrase 7c1e")
    device = Device(handle.path, handle.passphrase)
    rule = scene.proxy.on("POST", r"/auth/signup$", lambda e: UNAVAILABLE, times=1)
    result = device.run("account", "signup", "--relay", scene.proxy.url)
    assert "Traceback" not in result.stderr
    assert rule.hits == 1
    assert len(scene.proxy.requests("POST", r"/auth/signup$")) == 2
    (row,) = scene.relay.sql("SELECT count(*) AS n FROM accounts WHERE email = $1", EMAIL)
    assert row["n"] == 1


def test_the_cli_says_a_signup_whose_answer_was_lost_may_have_happened(scene: Scene) -> None:
    """Against an older relay: one line, exit 1, no traceback; then `account signin` (the
    check it names) works."""
    _as_an_older_relay(scene)
    handle = scene.blank_device("solo", "solo passphrase 7c1e")
    device = Device(handle.path, handle.passphrase)
    rule = scene.proxy.on("POST", r"/auth/signup$", lambda e: UNAVAILABLE, times=1)
    result = device.run("account", "signup", "--relay", scene.proxy.url, ok=False)
    assert result.returncode == 1, result.stdout + result.stderr
    (line,) = result.stderr.strip().splitlines()
    assert line.startswith("error: the relay at ")
    assert "POST /auth/signup (HTTP 503)" in line
    assert "run `engram-sync account signin` with the same email and password" in line
    assert "Traceback" not in result.stderr
    assert rule.hits == 1
    assert len(scene.proxy.requests("POST", r"/auth/signup$")) == 1
    (row,) = scene.relay.sql("SELECT count(*) AS n FROM accounts WHERE email = $1", EMAIL)
    assert row["n"] == 1  # it did happen
    signed = device.run("account", "signin", "--relay", scene.proxy.url)
    assert f"signed in as {EMAIL}" in signed.stdout


def test_a_lost_push_answer_is_retried_and_the_push_lands_once(scene: Scene) -> None:
    alpha, bravo = scene.device("alpha"), scene.device("bravo")
    memory_id = add(alpha, "pushed once")
    rule = scene.proxy.on("POST", r"/push$", _lose, times=1)
    with alpha.open() as session:
        client = RelayClient(
            scene.proxy.url,
            session.config.api_key,
            device_id=session.device.device_id,
            timeout=TIMEOUT_S,
            backoff_base=0.01,
        )
        with client:
            session.syncer(client).sync()
    assert rule.hits == 1
    assert len(scene.proxy.requests("POST", r"/push$")) == 2  # the lost one, and its retry
    (row,) = scene.relay.sql("SELECT count(*) AS n FROM blobs WHERE vault_id = $1", scene.vault_id)
    assert row["n"] == 1
    bravo.sync()
    assert contents(bravo) == {memory_id: "pushed once"}
    # The next sync pushes nothing again: the retry's `rejected` was recognised.
    assert alpha.sync().pushed == 0
