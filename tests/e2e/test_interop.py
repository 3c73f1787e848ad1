"""What our client writes, an independent §3 implementation reads, and the reverse."""

from __future__ import annotations

import httpx

from tests.e2e.conftest import PASSPHRASE, VAULT_ID, DeviceHandle
from tests.e2e.helpers import add, contents
from tests.e2e.independent_protocol import keys, memory, open_blob, seal_blob
from tests.relay.conftest import ADMIN_KEY


def _pull_all(relay_url: str) -> list[dict[str, object]]:
    with httpx.Client(base_url=relay_url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}) as c:
        response = c.get(f"/v1/vaults/{VAULT_ID}/pull", params={"cursor": 0})
        response.raise_for_status()
        blobs: list[dict[str, object]] = response.json()["blobs"]
        return blobs


def test_client_blobs_open_with_an_independent_implementation(
    devices: list[DeviceHandle],
) -> None:
    alpha = devices[0]
    memory_id = add(alpha, "interop: written by our client", tags=["x"])
    gone = add(alpha, "to be deleted")
    alpha.sync()
    from tests.e2e.helpers import delete

    delete(alpha, gone)
    alpha.sync()
    enc_key, hmac_key = keys(PASSPHRASE)
    blobs = {b["memory_id"]: b for b in _pull_all(alpha.relay.url)}
    live = open_blob(enc_key, hmac_key, blobs[memory_id])
    assert live["content"] == "interop: written by our client"
    assert live["tags"] == ["x"]
    assert set(live) == set(memory("m", "c"))  # exactly the §4 keys
    assert blobs[memory_id]["created_at"].endswith("+00:00")  # type: ignore[union-attr]
    assert open_blob(enc_key, hmac_key, blobs[gone]) == {"deleted": True, "id": gone}
    assert blobs[gone]["deleted"] is True


def test_independently_built_blobs_are_applied(devices: list[DeviceHandle]) -> None:
    alpha = devices[0]
    enc_key, hmac_key = keys(PASSPHRASE)
    foreign = "4f0c8c1e-1111-4222-8333-944455556666"
    live = seal_blob(
        enc_key, hmac_key, memory("mem_interop-0001", "from another implementation"),
        vault_id=VAULT_ID, device_id=foreign, clock=7,
    )  # fmt: skip
    doomed = seal_blob(
        enc_key, hmac_key, memory("mem_interop-0002", "short-lived"),
        vault_id=VAULT_ID, device_id=foreign, clock=8,
    )  # fmt: skip
    with httpx.Client(
        base_url=alpha.relay.url, headers={"Authorization": f"Bearer {ADMIN_KEY}"}
    ) as client:
        response = client.post(f"/v1/vaults/{VAULT_ID}/push", json={"blobs": [live, doomed]})
        assert response.json()["accepted"] == 2
        alpha.sync()
        assert contents(alpha)["mem_interop-0002"] == "short-lived"
        tomb = seal_blob(
            enc_key, hmac_key, {"deleted": True, "id": "mem_interop-0002"},
            vault_id=VAULT_ID, device_id=foreign, clock=9, deleted=True,
        )  # fmt: skip
        assert (
            client.post(f"/v1/vaults/{VAULT_ID}/push", json={"blobs": [tomb]}).json()["accepted"]
            == 1
        )
    report = alpha.sync()
    assert report.invalid == 0
    held = contents(alpha)
    assert held["mem_interop-0001"] == "from another implementation"
    assert "mem_interop-0002" not in held
    with alpha.open() as session:
        from engram_sync.client._vault import store as local_store

        applied = local_store.get_memory(session.vault.conn, "mem_interop-0001")
        assert applied is not None
        assert applied.embedding == [0.25, -0.5]
        assert applied.source == "ai-tool"
        assert session.device.vector_clock >= 9  # raised to the verified remote clocks
