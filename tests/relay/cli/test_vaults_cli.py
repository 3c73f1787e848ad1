"""`engram-relay vaults` (issue 14 item 18): list, show, quota, grant, as a person runs them.

Real CLI processes against a real relay's database; the quota set here is the one the
next push is judged by (relay/store/push.py reads `quotas` under the vault lock).
"""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.relay.accounts.helpers import http, signup
from tests.relay.conftest import Relay
from tests.relay.support import (
    Sealer,
    assert_error,
    client,
    module_relay,
    new_device_id,
    new_vault_id,
    push,
    push_ok,
)

BIN = Path(sys.executable).parent
DEFAULT_BYTES = 100_000  # the module relay's ENGRAM_RELAY_QUOTA_BYTES


@pytest.fixture(scope="module")
def served(postgres_url: str) -> Iterator[Relay]:
    with module_relay(postgres_url, quota_bytes=DEFAULT_BYTES) as relay:
        yield relay


def vaults(relay: Relay, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if "DATABASE_URL" not in k}
    return subprocess.run(
        [str(BIN / "engram-relay"), "vaults", *args, "--database-url", relay.database_url],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result
    return result.stdout


def one_line_error(result: subprocess.CompletedProcess[str], *needles: str) -> None:
    assert result.returncode == 2, result
    line = result.stderr.strip()
    assert "\n" not in line, line
    assert "Traceback" not in line
    for needle in needles:
        assert needle in line, line


def fields(text: str) -> dict[str, str]:
    return dict(ln.split(": ", 1) for ln in text.splitlines() if ": " in ln)


def row_of(table: str, vault_id: str) -> list[str]:
    (line,) = [ln for ln in table.splitlines() if f" {vault_id} " in ln]
    return [cell.strip() for cell in line.strip().strip("│┃").split("│")]


def test_list_and_show(served: Relay) -> None:
    ops, theirs = new_vault_id("ops"), new_vault_id("theirs")
    sealer = Sealer(ops)
    with client(served) as operator:
        push_ok(operator, ops, [sealer.sized("a", 1, 400), sealer.sized("b", 1, 600)])
    alice = signup(served)
    with alice.client(served) as c:
        assert c.post("/account/keys", json={"vault_id": theirs}).status_code == 200
    table = ok(vaults(served, "list"))
    for heading in ("vault", "blobs", "bytes", "devices", "last push", "owner", "quota"):
        assert heading in table
    cells = row_of(table, ops)
    assert cells[:4] == [ops, "2", "1000", "1"], cells
    assert cells[4].startswith("20")  # an ISO time
    assert cells[5:] == ["operator", "default"]
    assert row_of(table, theirs)[5] == f"account {alice.account_id}"

    shown = fields(ok(vaults(served, "show", ops)))
    assert shown["owner"] == "operator"
    assert (shown["blobs"], shown["bytes"], shown["tombstones"]) == ("2", "1000", "0")
    assert shown["quota bytes"] == "default"
    assert shown["grants"] == "none"
    assert fields(ok(vaults(served, "show", theirs)))["owner"] == (
        f"account {alice.account_id} <{alice.email.lower()}>"
    )
    assert fields(ok(vaults(served, "show", theirs)))["last push"] == "never"
    one_line_error(vaults(served, "show", new_vault_id("nowhere")), "no vault", "vaults list")


def test_a_quota_set_here_is_enforced_on_the_next_push(served: Relay) -> None:
    vault_id = new_vault_id("quota")
    sealer = Sealer(vault_id)
    with client(served) as c:
        push_ok(c, vault_id, [sealer.sized("a", 1, 400)])
        assert push(c, vault_id, [sealer.sized("b", 1, 400)]).status_code == 200
        out = ok(vaults(served, "quota", vault_id, "--bytes", "1000"))
        assert out.strip() == f"vault {vault_id} quota: bytes 1000, devices default"
        refused = push(c, vault_id, [sealer.sized("c", 1, 400)])  # 1,200 > 1,000
        assert refused.status_code == 402, refused.text
        assert refused.json()["error"] == {
            "code": "quota_exceeded",
            "detail": "bytes",
            "limit": 1000,
            "used": 1200,
        }
        assert row_of(ok(vaults(served, "list")), vault_id)[6] == "bytes 1000, devices default"
        ok(vaults(served, "quota", vault_id, "--bytes", "default"))  # the relay's 100,000
        push_ok(c, vault_id, [sealer.sized("c", 1, 400)])
        assert row_of(ok(vaults(served, "list")), vault_id)[6] == "default"

        ok(vaults(served, "quota", vault_id, "--devices", "1", "--bytes", "0"))
        assert fields(ok(vaults(served, "show", vault_id)))["quota bytes"] == "unlimited"
        second = sealer.sized("d", 1, 400, device_id=new_device_id())
        devices = push(c, vault_id, [second])
        assert devices.status_code == 402, devices.text
        assert devices.json()["error"]["detail"] == "devices"
        ok(vaults(served, "quota", vault_id, "--devices", "0"))
        push_ok(c, vault_id, [second])


def test_quota_input_is_checked(served: Relay) -> None:
    vault_id = new_vault_id("bad")
    one_line_error(vaults(served, "quota", vault_id), "give --bytes and/or --devices")
    one_line_error(vaults(served, "quota", vault_id, "--bytes", "-1"), "--bytes must be >= 0")
    one_line_error(vaults(served, "quota", vault_id, "--devices", "lots"), "--devices must be")
    one_line_error(vaults(served, "quota", "", "--bytes", "1"), "vault id is empty")
    assert not served.sql("SELECT 1 FROM quotas WHERE vault_id = $1", vault_id)


def test_grant_and_ungrant(served: Relay) -> None:
    vault_id = new_vault_id("granted")
    with client(served) as c:
        push_ok(c, vault_id, [Sealer(vault_id).blob("m", 1)])
    bob = signup(served)

    def mint() -> httpx.Response:
        with http(served, bob.token) as c:
            return c.post("/account/keys", json={"vault_id": vault_id})

    assert_error(mint(), 403, "vault_owned")
    out = ok(vaults(served, "grant", vault_id, bob.email))
    assert out.strip() == f"account {bob.account_id} granted vault {vault_id} (member)"
    assert mint().status_code == 200
    assert mint().json()["is_admin"] is False  # PROTOCOL §13: a member grant's keys
    shown = ok(vaults(served, "show", vault_id))
    assert bob.account_id in shown
    assert "cli" in shown
    assert "member" in shown
    assert fields(shown)["active keys"] == "0 operator, 2 account"
    # --admin (issue 31 finding 4): the operator gives the admin role.
    out = ok(vaults(served, "grant", vault_id, bob.email, "--admin"))
    assert out.strip() == f"account {bob.account_id} granted vault {vault_id} (admin)"
    assert mint().json()["is_admin"] is True
    assert "admin" in ok(vaults(served, "show", vault_id))
    ok(vaults(served, "ungrant", vault_id, bob.account_id))
    assert_error(mint(), 403, "vault_owned")
    # Removing the grant revoked the keys minted under it (PROTOCOL §13).
    assert fields(ok(vaults(served, "show", vault_id)))["active keys"] == "0 operator, 0 account"
    one_line_error(vaults(served, "ungrant", vault_id, bob.email), "has no grant")
    one_line_error(vaults(served, "grant", vault_id, "nobody@example.org"), "no account")
    # Granting a fresh id is operator use: the operator owns it, the account is let in.
    fresh = new_vault_id("reserved")
    ok(vaults(served, "grant", fresh, bob.email))
    assert fields(ok(vaults(served, "show", fresh)))["owner"] == "operator"
