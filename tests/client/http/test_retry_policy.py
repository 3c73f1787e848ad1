"""Every relay call names its retry policy (issue 19 "Retries", docs/retries.md).

The pin lists every call and its policy, so a new call must choose one. The policy
unit tests script the transport with an httpx.MockTransport (like the backoff tests in
test_relay_client.py); the same behaviour against a real relay behind a proxy that
loses answers is in tests/e2e/hostile/test_lost_answers_retry.py.
"""

from __future__ import annotations

import ast
from pathlib import Path
from typing import Any

import httpx
import pytest

from engram_sync.client._errors import OutcomeUnknownError, RelayUnavailableError
from engram_sync.client._http.account_client import AccountClient
from engram_sync.client._http.relay_client import RelayClient, Retry

CLIENT = Path(__file__).resolve().parents[3] / "client"

# (module, method) -> policy of its relay call. A new call must be added here.
PINNED: dict[tuple[str, str], str] = {
    ("relay_client", "info"): "SAFE",
    ("relay_client", "health"): "SAFE",
    ("relay_client", "push"): "SAFE",  # PROTOCOL §6: an equal clock is stale
    ("relay_client", "pull"): "SAFE",
    ("relay_client", "stats"): "SAFE",
    ("relay_client", "devices"): "SAFE",
    ("relay_client", "register_device"): "SAFE",
    ("relay_client", "revoke_device"): "SAFE",
    ("account_client", "signup"): "IDEMPOTENT",
    ("account_client", "signin"): "SAFE",
    ("account_client", "logout"): "SAFE",
    ("account_client", "recover_start"): "SAFE",
    ("account_client", "recover"): "SAFE",
    ("account_client", "account"): "SAFE",
    ("account_client", "mint_key"): "IDEMPOTENT",
    ("account_client", "wraps"): "SAFE",
    ("account_client", "password_wrap"): "SAFE",
    ("account_client", "put_password_wrap"): "SAFE",
    ("account_client", "put_recovery_wrap"): "SAFE",
    ("account_client", "vault_wrap"): "SAFE",
    ("account_client", "put_vault_wrap"): "SAFE",
    ("account_client", "delete_vault_wrap"): "SAFE",
    ("account_client", "create_pairing_code"): "IDEMPOTENT",
    ("account_client", "redeem_pairing_code"): "IDEMPOTENT",
    ("account_client", "handoff_request"): "IDEMPOTENT",
    ("account_client", "handoff_pending"): "SAFE",
    ("account_client", "handoff_status"): "SAFE",
    ("account_client", "handoff_seal"): "SAFE",  # a repeat is 409 already_sealed
    ("account_client", "handoff_claim"): "NEVER_AFTER_SEND",
    ("account_client", "handoff_cancel"): "SAFE",
    ("account_client", "grant_vault"): "SAFE",
    ("account_client", "vault_grants"): "SAFE",
    ("account_client", "revoke_vault_grant"): "SAFE",
    ("relay_client", "digest"): "SAFE",  # PROTOCOL §18: reads
    ("relay_client", "fetch"): "SAFE",  # a POST that only reads current blobs
    ("relay_client", "retire"): "SAFE",  # PROTOCOL §19: a repeated retire answers the same
    ("relay_client", "narrow"): "SAFE",  # PROTOCOL §18, ours: a POST that only reads
}


def _calls() -> dict[tuple[str, str], str]:
    """Every `self._call(...)` / `self._send(...)` in client/, by enclosing method."""
    found: dict[tuple[str, str], str] = {}
    for path in sorted(CLIENT.rglob("*.py")):
        tree = ast.parse(path.read_text())
        for func in ast.walk(tree):
            if not isinstance(func, ast.FunctionDef) or func.name in {"_call", "_send"}:
                continue
            for node in ast.walk(func):
                if not (
                    isinstance(node, ast.Call)
                    and isinstance(node.func, ast.Attribute)
                    and node.func.attr in {"_call", "_send"}
                ):
                    continue
                policy = next((k.value for k in node.keywords if k.arg == "retry"), None)
                key = (path.stem, func.name)
                assert key not in found, f"{key}: one relay call per method"
                assert isinstance(policy, ast.Attribute), f"{key} names no retry policy"
                found[key] = policy.attr
    return found


def test_every_call_names_its_policy_and_the_list_is_pinned() -> None:
    assert _calls() == PINNED


# -- the policies, scripted ---------------------------------------------------------------

MINTED = {
    "id": "key_1",
    "key": "esk_" + "a" * 40,
    "prefix": "esk_aaaa",
    "vault_id": "v1",
    "device_id": "d1",
    "is_admin": True,
    "label": None,
}
Step = type[httpx.TransportError] | tuple[int, str]
INFO: dict[str, Any] = {
    "protocol": "engram-sync/5.1",
    "max_blobs_per_push": 1000,
    "max_blob_bytes": 1048576,
    "max_pull_limit": 1000,
    "max_body_bytes": 67108864,
}


class Script:
    """Answers `steps` in order (an exception class is raised), then `final` with 200.

    `GET /v1/info` is answered apart (not counted, not a step) with `features`: without
    `idempotency-keys` an IDEMPOTENT call is retried as NEVER_AFTER_SEND.
    """

    def __init__(
        self, steps: list[Step], final: dict[str, Any], features: tuple[str, ...] = ()
    ) -> None:
        self.steps = steps
        self.final = final
        self.features = features
        self.requests = 0
        self.idempotency_keys: list[str | None] = []

    def __call__(self, request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/info":
            return httpx.Response(200, json={**INFO, "features": list(self.features)})
        self.requests += 1
        self.idempotency_keys.append(request.headers.get("Idempotency-Key"))
        if not self.steps:
            return httpx.Response(200, json=self.final)
        step = self.steps.pop(0)
        if isinstance(step, tuple):
            status, code = step
            return httpx.Response(status, json={"error": "scripted", "code": code})
        raise step("scripted failure", request=request)


def _account(script: Script) -> AccountClient:
    return AccountClient(
        "http://relay.test",
        "ses_" + "s" * 40,
        transport=httpx.MockTransport(script),
        sleep=lambda _: None,
    )


def _mint(script: Script) -> str:
    with _account(script) as client:
        return client.mint_key("v1", device_id="d1", label=None).id


@pytest.mark.parametrize(
    "failure",
    [httpx.ReadTimeout, httpx.RemoteProtocolError, httpx.ReadError, httpx.WriteError],
)
def test_a_mint_that_may_have_arrived_is_not_sent_again(
    failure: type[httpx.TransportError],
) -> None:
    script = Script([failure], MINTED)
    with pytest.raises(OutcomeUnknownError) as caught:
        _mint(script)
    assert script.requests == 1
    message = str(caught.value)
    assert "POST /account/keys" in message
    assert "engram-sync devices" in message
    assert isinstance(caught.value, RelayUnavailableError)  # handled like one by callers


@pytest.mark.parametrize("failure", [httpx.ConnectError, httpx.ConnectTimeout, httpx.PoolTimeout])
def test_a_mint_that_never_left_is_retried(failure: type[httpx.TransportError]) -> None:
    script = Script([failure, failure], MINTED)
    assert _mint(script) == "key_1"
    assert script.requests == 3


@pytest.mark.parametrize("refusal", [(429, "rate_limited"), (503, "busy"), (503, "overloaded")])
def test_a_mint_the_relay_refused_unprocessed_is_retried(refusal: tuple[int, str]) -> None:
    script = Script([refusal, refusal], MINTED)
    assert _mint(script) == "key_1"
    assert script.requests == 3


@pytest.mark.parametrize(
    "answer", [(503, "unavailable"), (500, "internal_error"), (502, "http_502"), (504, "x")]
)
def test_a_mint_answered_by_a_failure_that_may_follow_a_commit_is_not_retried(
    answer: tuple[int, str],
) -> None:
    script = Script([answer], MINTED)
    with pytest.raises(OutcomeUnknownError, match=f"HTTP {answer[0]}"):
        _mint(script)
    assert script.requests == 1


@pytest.mark.parametrize("failure", [httpx.ReadTimeout, (503, "unavailable"), (500, "x")])
def test_a_safe_call_is_retried_after_any_failure(failure: Step) -> None:
    """The positive case next to the exclusions: a GET is repeated after the same failures."""
    script = Script([failure], {"vaults": []})
    with _account(script) as client:
        client._call("GET", "/account", dict, retry=Retry.SAFE)
    assert script.requests == 2


def test_redeem_is_retried_while_nothing_was_sent() -> None:
    """Redeeming was sent exactly once before; a connect error now retries it safely."""
    redeemed = {
        "vault_id": "v1",
        "api_key": "esk_" + "b" * 40,
        "key_id": "key_2",
        "device_id": "d1",
        "label": "laptop",
        "device_bound": True,
    }
    script = Script([httpx.ConnectError], redeemed)
    with AccountClient(
        "http://relay.test", None, transport=httpx.MockTransport(script), sleep=lambda _: None
    ) as client:
        assert client.redeem_pairing_code("ENG-AAAA-BBBB-CCCC", "d1", None).key_id == "key_2"
    assert script.requests == 2
    script = Script([httpx.ReadTimeout], redeemed)
    with (
        AccountClient(
            "http://relay.test", None, transport=httpx.MockTransport(script), sleep=lambda _: None
        ) as client,
        pytest.raises(OutcomeUnknownError, match="ask the admin for a new code"),
    ):
        client.redeem_pairing_code("ENG-AAAA-BBBB-CCCC", "d1", None)
    assert script.requests == 1


def test_a_never_after_send_call_must_say_what_a_lost_answer_means() -> None:
    script = Script([], {})
    with (
        RelayClient("http://relay.test", None, transport=httpx.MockTransport(script)) as client,
        pytest.raises(ValueError, match="lost"),
    ):
        client._call("POST", "/x", dict, retry=Retry.NEVER_AFTER_SEND)
    assert script.requests == 0


# -- IDEMPOTENT: an Idempotency-Key makes the creating calls retryable ----------------------


@pytest.mark.parametrize(
    "failure", [httpx.ReadTimeout, httpx.RemoteProtocolError, (503, "unavailable"), (500, "x")]
)
def test_a_mint_is_retried_under_one_key_when_the_relay_honours_keys(failure: Step) -> None:
    script = Script([failure, failure], MINTED, features=("idempotency-keys",))
    assert _mint(script) == "key_1"
    assert script.requests == 3
    (key,) = set(script.idempotency_keys)  # the same key on every attempt
    assert key is not None
    assert len(key) == 22
    # the next call is another request: another key
    again = Script([], MINTED, features=("idempotency-keys",))
    _mint(again)
    assert again.idempotency_keys[0] not in {None, key}


def test_without_the_feature_the_key_is_sent_but_a_lost_answer_is_not_retried() -> None:
    """The exclusion next to it: an older relay ignores the header, so no blind retry."""
    script = Script([httpx.ReadTimeout], MINTED)
    with pytest.raises(OutcomeUnknownError):
        _mint(script)
    assert script.requests == 1
    assert script.idempotency_keys[0] is not None


def test_a_relay_without_info_gets_the_cautious_policy() -> None:
    def answer(request: httpx.Request) -> httpx.Response:
        if request.url.path == "/v1/info":
            return httpx.Response(404, json={"error": "no such route", "code": "not_found"})
        raise httpx.ReadTimeout("lost", request=request)

    with (
        AccountClient(
            "http://relay.test",
            "ses_" + "s" * 40,
            transport=httpx.MockTransport(answer),
            sleep=lambda _: None,
        ) as client,
        pytest.raises(OutcomeUnknownError),
    ):
        client.mint_key("v1", device_id="d1", label=None)
