"""The device roster, registration and revocation (PROTOCOL §5, §10), over real HTTP."""

from __future__ import annotations

import httpx
import pytest

from engram_sync.shared_format import parse_rfc3339
from tests.relay.conftest import Relay
from tests.relay.support import (
    Sealer,
    assert_error,
    client,
    module_relay_fixture,
    new_device_id,
    new_vault_id,
    pull,
    push_ok,
)

relay = module_relay_fixture()


def register(http: httpx.Client, vault: str, device_id: str, label: str) -> httpx.Response:
    return http.post(
        f"/v1/vaults/{vault}/devices/register", json={"device_id": device_id, "label": label}
    )


def roster(http: httpx.Client, vault: str) -> list[dict[str, object]]:
    response = http.get(f"/v1/vaults/{vault}/devices")
    assert response.status_code == 200, response.text
    body = response.json()
    assert body["vault_id"] == vault
    devices: list[dict[str, object]] = body["devices"]
    return devices


def test_register_answers_200_and_trims(http: httpx.Client, vault: str) -> None:
    device = new_device_id()
    response = register(http, vault, f"  {device} ", "  Work laptop  ")
    assert response.status_code == 200
    assert response.json() == {
        "vault_id": vault,
        "device_id": device,
        "label": "Work laptop",
        "registered": True,
    }
    (entry,) = roster(http, vault)
    assert entry["device_id"] == device
    assert entry["label"] == "Work laptop"
    assert entry["blob_count"] == 0
    assert entry["revoked"] is False
    assert isinstance(entry["last_seen"], str)
    parse_rfc3339(entry["last_seen"])
    # Relabelling is allowed.
    assert register(http, vault, device, "Old laptop").json()["label"] == "Old laptop"
    assert [d["label"] for d in roster(http, vault)] == ["Old laptop"]


@pytest.mark.parametrize(
    ("device_id", "label", "field"),
    [
        ("", "laptop", "device_id"),
        ("   ", "laptop", "device_id"),
        ("dev", "", "label"),
        ("dev", "   ", "label"),
        ("dev", "x" * 129, "label"),
        ("d" * 257, "laptop", "device_id"),
    ],
)
def test_register_validates_both_fields(
    relay: Relay, http: httpx.Client, vault: str, device_id: str, label: str, field: str
) -> None:
    body = assert_error(register(http, vault, device_id, label), 400, "invalid_request")
    assert body["field"] == field
    assert roster(http, vault) == []
    assert register(http, vault, "dev", "x" * 128).status_code == 200  # the limit itself is fine


@pytest.mark.parametrize(
    "body", [{"device_id": "d"}, {"label": "l"}, {"device_id": 5, "label": "l"}, [], "x"]
)
def test_register_with_a_bad_body_is_400(http: httpx.Client, vault: str, body: object) -> None:
    response = http.post(f"/v1/vaults/{vault}/devices/register", json=body)
    assert_error(response, 400)


def test_roster_lists_pushers_and_registered_devices_newest_first(
    relay: Relay, http: httpx.Client, vault: str
) -> None:
    laptop, phone = Sealer(vault), Sealer(vault)
    push_ok(http, vault, [laptop.blob("a", 1), laptop.blob("b", 1), laptop.blob("c", 1)])
    push_ok(http, vault, [phone.blob("c", 2)])  # phone's version replaces laptop's "c"
    tablet = new_device_id()
    register(http, vault, tablet, "tablet")
    relay.sql(
        "UPDATE devices SET last_seen = now() - interval '1 hour' WHERE device_id = $1",
        laptop.device_id,
    )
    relay.sql(
        "UPDATE devices SET last_seen = now() - interval '2 hours' WHERE device_id = $1",
        phone.device_id,
    )
    devices = roster(http, vault)
    assert [d["device_id"] for d in devices] == [tablet, laptop.device_id, phone.device_id]
    assert [d["blob_count"] for d in devices] == [0, 2, 1]
    assert [d["label"] for d in devices] == ["tablet", None, None]
    stamps = [parse_rfc3339(str(d["last_seen"])) for d in devices]
    assert stamps == sorted(stamps, reverse=True)
    # Another vault's roster does not show them.
    assert roster(http, new_vault_id()) == []


def test_revoke_is_idempotent_and_shows_in_the_roster(
    relay: Relay, http: httpx.Client, vault: str
) -> None:
    sealer = Sealer(vault)
    push_ok(http, vault, [sealer.blob("a", 1)])
    for _ in range(2):
        response = http.delete(f"/v1/vaults/{vault}/devices/{sealer.device_id}")
        assert response.status_code == 200
        assert response.json() == {
            "vault_id": vault,
            "device_id": sealer.device_id,
            "revoked": True,
        }
    (entry,) = roster(http, vault)
    assert entry["revoked"] is True
    (first,) = relay.sql(
        "SELECT revoked_at FROM devices WHERE vault_id = $1 AND device_id = $2",
        vault,
        sealer.device_id,
    )
    http.delete(f"/v1/vaults/{vault}/devices/{sealer.device_id}")
    (again,) = relay.sql(
        "SELECT revoked_at FROM devices WHERE vault_id = $1 AND device_id = $2",
        vault,
        sealer.device_id,
    )
    assert again["revoked_at"] == first["revoked_at"]  # the first revocation time is kept
    # Re-registering a label does not un-revoke.
    assert register(http, vault, sealer.device_id, "back again").status_code == 200
    (entry,) = roster(http, vault)
    assert (entry["revoked"], entry["label"]) == (True, "back again")
    # Its data stays pullable by others; its new pushes are refused.
    answer = push_ok(http, vault, [sealer.blob("a", 2)])
    assert answer["revoked_devices"] == [sealer.device_id]


def test_revoking_a_never_seen_device_preempts_it(http: httpx.Client, vault: str) -> None:
    stolen = Sealer(vault)
    assert http.delete(f"/v1/vaults/{vault}/devices/{stolen.device_id}").status_code == 200
    answer = push_ok(http, vault, [stolen.blob("a", 1)])
    assert (answer["accepted"], answer["revoked_devices"]) == (0, [stolen.device_id])


def test_revoking_a_device_revokes_its_keys_and_only_its_keys(
    relay: Relay, http: httpx.Client, vault: str
) -> None:
    laptop, phone = Sealer(vault), Sealer(vault)
    laptop_keys = [relay.mint(vault, device_id=laptop.device_id) for _ in range(2)]
    phone_key = relay.mint(vault, device_id=phone.device_id)
    elsewhere = new_vault_id()
    same_device_other_vault = relay.mint(elsewhere, device_id=laptop.device_id)
    for key in laptop_keys:
        with client(relay, key) as bound:
            assert push_ok(bound, vault, [laptop.blob(key[-6:], 1)])["accepted"] == 1
    http.delete(f"/v1/vaults/{vault}/devices/{laptop.device_id}")
    rows = relay.sql(
        "SELECT device_id, vault_id, revoked_at IS NOT NULL AS revoked FROM api_keys"
        " WHERE device_id IN ($1, $2)",
        laptop.device_id,
        phone.device_id,
    )
    revoked = {(r["vault_id"], r["device_id"]): r["revoked"] for r in rows}
    assert revoked[(vault, laptop.device_id)] is True
    assert revoked[(vault, phone.device_id)] is False
    assert revoked[(elsewhere, laptop.device_id)] is False  # revocation is per vault
    for key in laptop_keys:
        with client(relay, key) as bound:
            assert_error(pull(bound, vault, cursor=0), 403, "device_revoked")
    with client(relay, phone_key) as bound:
        assert push_ok(bound, vault, [phone.blob("p", 1)])["accepted"] == 1
    with client(relay, same_device_other_vault) as bound:
        assert pull(bound, elsewhere, cursor=0).status_code == 200


def test_device_id_in_the_path_is_validated(http: httpx.Client, vault: str) -> None:
    body = assert_error(http.delete(f"/v1/vaults/{vault}/devices/{'d' * 257}"), 400)
    assert body["field"] == "device_id"


@pytest.mark.parametrize(
    "label",
    [
        "laptop\nphone  2026-12-01  0  False",  # a fake second roster line
        "lap\rtop",  # carriage return inside (the ends are trimmed)
        "\x1b[31mred\x1b[0m",  # ANSI escape (ESC, Cc)
        "tab\there",
        "c1\x9b31m",  # C1 CSI (Cc)
        "evil\u202egnp.exe",  # right-to-left override (Cf)
        "zero\u200bwidth",  # zero-width space (Cf)
        "line\u2028separator",  # Zl
        "para\u2029separator",  # Zp
        "nul\x00",
        "del\x7f",
    ],
)
def test_labels_are_printable_text(http: httpx.Client, vault: str, label: str) -> None:
    body = assert_error(register(http, vault, new_device_id(), label), 400, "invalid_request")
    assert body["field"] == "label"
    assert roster(http, vault) == []


@pytest.mark.parametrize("label", ["Ana's laptop (2)", "Ünïcødé ノート 💻", "a", "x" * 128])
def test_printable_labels_are_kept_as_sent(http: httpx.Client, vault: str, label: str) -> None:
    device = new_device_id()
    assert register(http, vault, device, label).json()["label"] == label
    assert [d["label"] for d in roster(http, vault)] == [label]


def test_who_may_label_a_device(relay: Relay, http: httpx.Client, vault: str) -> None:
    # Our reading of PROTOCOL §5 with §10: a device-bound key labels its own device, an
    # admin key any device, any other key a device without a label (or the same label).
    laptop, phone = new_device_id(), new_device_id()
    member = relay.mint(vault)
    laptop_key = relay.mint(vault, device_id=laptop)
    vault_admin = relay.mint(vault, admin=True)
    with client(relay, member) as m:
        assert register(m, vault, laptop, "laptop").status_code == 200  # a new device
        assert register(m, vault, laptop, "laptop").status_code == 200  # link run again
        refused = assert_error(register(m, vault, laptop, "Mallory's"), 403, "label_locked")
        assert laptop in str(refused["error"])
    with client(relay, laptop_key) as own:
        assert register(own, vault, laptop, "my laptop").status_code == 200
        assert_error(register(own, vault, phone, "phone"), 403, "forbidden")
    with client(relay, member) as m:
        assert_error(register(m, vault, laptop, "laptop"), 403, "label_locked")
    with client(relay, vault_admin) as a:
        assert register(a, vault, laptop, "Ana's laptop").status_code == 200
    assert [d["label"] for d in roster(http, vault)] == ["Ana's laptop"]
    # A device that pushed without a label gets its first one from a member key.
    pusher = Sealer(vault)
    push_ok(http, vault, [pusher.blob("a", 1)])
    with client(relay, member) as m:
        assert register(m, vault, pusher.device_id, "desktop").status_code == 200
    # An admin key of another vault is a member nowhere here.
    elsewhere_admin = relay.mint(new_vault_id(), admin=True)
    with client(relay, elsewhere_admin) as other:
        assert_error(register(other, vault, laptop, "x"), 403, "forbidden")
    labels = {d["device_id"]: d["label"] for d in roster(http, vault)}
    assert labels == {laptop: "Ana's laptop", pusher.device_id: "desktop"}


def test_a_vault_quota_row_limits_registrations(relay: Relay, http: httpx.Client) -> None:
    vault = new_vault_id()
    relay.sql("INSERT INTO quotas (vault_id, max_devices) VALUES ($1, 2)", vault)
    first, second, third = new_device_id(), new_device_id(), new_device_id()
    assert register(http, vault, first, "one").status_code == 200
    assert register(http, vault, second, "two").status_code == 200
    response = register(http, vault, third, "three")
    assert response.status_code == 402
    assert response.json() == {
        "error": {"code": "quota_exceeded", "detail": "devices", "limit": 2, "used": 3}
    }
    assert register(http, vault, first, "one again").status_code == 200  # it has a slot
    assert {d["device_id"] for d in roster(http, vault)} == {first, second}
