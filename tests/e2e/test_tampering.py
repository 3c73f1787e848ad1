"""Tampering with any stored column of a blob is detected by every client (issue 8 §5)."""

from __future__ import annotations

import base64

from engram_sync.shared_format.blob import BlobCipher
from tests.e2e.conftest import DeviceHandle
from tests.e2e.helpers import add, contents

# column -> SQL expression producing the tampered value (from the row's own values)
TAMPERS = {
    "vault_id": None,  # a blob sealed for another vault, served in this one
    "memory_id": "memory_id || '-x'",
    "device_id": "'00000000-0000-4000-8000-000000000000'",
    "vector_clock": "vector_clock + 1000",
    "ciphertext": None,  # one bit flipped, computed in Python
    "hmac": None,  # another blob's valid HMAC
    "created_at": "'2030-01-01T00:00:00.000000+00:00'",
    "deleted": "NOT deleted",
}


def test_every_tampered_column_is_detected(devices: list[DeviceHandle]) -> None:
    alpha, bravo, charlie = devices
    ids = {column: add(alpha, f"victim of {column}") for column in TAMPERS}
    control = add(alpha, "untouched control")
    alpha.sync()
    relay = alpha.relay
    for column, expression in TAMPERS.items():
        memory_id = ids[column]
        if column == "ciphertext":
            (row,) = relay.sql("SELECT ciphertext FROM blobs WHERE memory_id = $1", memory_id)
            raw = bytearray(base64.b64decode(row["ciphertext"]))
            raw[-1] ^= 0x80
            relay.sql(
                "UPDATE blobs SET ciphertext = $2 WHERE memory_id = $1",
                memory_id,
                base64.b64encode(bytes(raw)).decode(),
            )
        elif column == "hmac":
            relay.sql(
                "UPDATE blobs SET hmac = (SELECT hmac FROM blobs WHERE memory_id = $2)"
                " WHERE memory_id = $1",
                memory_id,
                control,
            )
        elif column == "vault_id":
            # a genuine blob of another vault (same passphrase), relabelled into this one
            with alpha.open() as session:
                foreign = BlobCipher(session.keys).seal(
                    "from another vault",
                    vault_id="other-vault",
                    memory_id=memory_id,
                    device_id=session.device.device_id,
                    vector_clock=10**6,
                    deleted=False,
                )
            relay.sql(
                "UPDATE blobs SET ciphertext = $2, hmac = $3, vector_clock = $4,"
                " created_at = $5 WHERE memory_id = $1",
                memory_id,
                foreign.ciphertext,
                foreign.hmac,
                foreign.vector_clock,
                foreign.created_at,
            )
        else:
            relay.sql(
                f"UPDATE blobs SET {column} = {expression} WHERE memory_id = $1",
                memory_id,
            )

    for device in (bravo, charlie):
        report = device.sync()
        assert report.invalid == len(TAMPERS), device.name
        assert report.applied == 1, device.name
        assert contents(device) == {control: "untouched control"}
        with device.open() as session:
            reasons = {s.reason.split(":")[0] for s in session.state.skipped}
            assert len(session.state.skipped) == len(TAMPERS)
            assert reasons == {"BlobTamperedError"}
