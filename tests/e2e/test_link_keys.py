"""`engram-sync link` registers the device's label with every kind of key (PROTOCOL §5, §10).

The relay lets a key bound to a device label that device, an admin key label any
device, and any other key of the vault give a device its first label or repeat it
(relay/http/routes/devices.py); these are the keys `link` is run with.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engram_sync.client._errors import ForbiddenError
from tests.e2e.conftest import VAULT_ID, make_device
from tests.relay.conftest import Relay


def labels(relay: Relay) -> dict[str, str]:
    rows = relay.sql("SELECT device_id, label FROM devices WHERE vault_id = $1", VAULT_ID)
    return {r["device_id"]: r["label"] for r in rows}


def test_link_works_with_operator_bound_and_member_keys(tmp_path: Path, relay: Relay) -> None:
    member = relay.mint(VAULT_ID)
    operator = make_device(tmp_path, relay, "operator")
    bound = make_device(
        tmp_path, relay, "bound", key=lambda device_id: relay.mint(VAULT_ID, device_id=device_id)
    )
    plain = make_device(tmp_path, relay, "plain", key=member)
    ids = {}
    for handle in (operator, bound, plain):
        with handle.open() as session:
            ids[handle.name] = session.device.device_id
    assert labels(relay) == {ids["operator"]: "operator", ids["bound"]: "bound",
                             ids["plain"]: "plain"}  # fmt: skip
    # Linking again with the same label (a re-run of the same command) works with a
    # member key; changing the label needs the device's own key or an admin key.
    with plain.open() as session:
        assert session.link(relay.url, member, VAULT_ID, "plain") == VAULT_ID
        with pytest.raises(ForbiddenError) as refused:
            session.link(relay.url, member, VAULT_ID, "renamed")
        assert refused.value.code == "label_locked"
        assert session.device.label == "plain"  # the refused label was not kept locally
    assert labels(relay)[ids["plain"]] == "plain"
