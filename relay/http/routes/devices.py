"""The device roster, registration and revocation (PROTOCOL §5, §10)."""

from __future__ import annotations

from typing import Any

from litestar import Request, delete, get, post
from litestar.params import FromPath, JSONBody

from engram_sync.relay.domain.labels import label_problem
from engram_sync.relay.http.app_state import relay_state
from engram_sync.relay.http.errors import bad_request, forbidden
from engram_sync.relay.http.routes.ids import require_id
from engram_sync.relay.http.routes.retire import authorize_until_erased
from engram_sync.relay.store import devices as store
from engram_sync.shared_format.wire import (
    DeviceRegistered,
    DeviceRevoked,
    DeviceRoster,
    RegisterDeviceRequest,
)


@get("/v1/vaults/{vault_id:str}/devices", tags=["devices"])
async def list_devices(request: Request[Any, Any, Any], vault_id: FromPath[str]) -> DeviceRoster:
    """Every device that pushed, pulled or registered, newest first."""
    await authorize_until_erased(request, require_id(vault_id, "vault_id"))  # PROTOCOL §19
    devices = await store.roster(relay_state(request).require_pool(), vault_id)
    return DeviceRoster(vault_id=vault_id, devices=devices)


@post("/v1/vaults/{vault_id:str}/devices/register", status_code=200, tags=["devices"])
async def register_device(
    request: Request[Any, Any, Any], vault_id: FromPath[str], data: JSONBody[RegisterDeviceRequest]
) -> DeviceRegistered:
    """Label a device: both fields non-empty after trim, the label printable text of at
    most 128 characters (relay/domain/labels.py).

    Who may label (our reading of PROTOCOL §5 with §10): a key bound to a device labels
    only that device; an admin key of the vault labels any device; any other key of the
    vault may give a device its first label or repeat the label it has (how `engram-sync
    link` registers), not replace another one (403 `label_locked`). A device that takes
    no slot yet counts against the vault's device quota (402, the §5 body).
    """
    principal = await authorize_until_erased(request, require_id(vault_id, "vault_id"))  # §19
    device_id, label = data.device_id.strip(), data.label.strip()
    require_id(device_id, "device_id")
    if not label:
        raise bad_request("label is empty", code="invalid_request", field="label")
    problem = label_problem(label)
    if problem:
        raise bad_request(problem, code="invalid_request", field="label")
    if principal.device_id is not None and principal.device_id != device_id:
        raise forbidden("this key is bound to another device")
    state = relay_state(request)
    # LabelLockedError and DeviceQuotaError are answered by relay/http/errors.py (403, 402).
    await store.register(
        state.require_pool(),
        vault_id,
        device_id,
        label,
        may_relabel=principal.device_id == device_id or principal.is_admin_for(vault_id),
        default_max_devices=state.config.quota_devices,
    )
    return DeviceRegistered(vault_id=vault_id, device_id=device_id, label=label)


@delete("/v1/vaults/{vault_id:str}/devices/{device_id:str}", status_code=200, tags=["devices"])
async def revoke_device(
    request: Request[Any, Any, Any], vault_id: FromPath[str], device_id: FromPath[str]
) -> DeviceRevoked:
    """Revoke a device and every key bound to it (admin; idempotent)."""
    await authorize_until_erased(request, require_id(vault_id, "vault_id"), admin=True)  # §19
    require_id(device_id, "device_id")
    await store.revoke(relay_state(request).require_pool(), vault_id, device_id)
    return DeviceRevoked(vault_id=vault_id, device_id=device_id)
