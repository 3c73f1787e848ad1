"""The device roster, registration and revocation (PROTOCOL §5, §10)."""

from __future__ import annotations

from typing import Any, Final

from litestar import Request, delete, get, post
from litestar.params import FromPath, JSONBody

from relay.auth import authorize
from relay.errors import bad_request, forbidden
from relay.ids import require_id
from relay.state import relay_state
from relay.store import devices as store
from shared_format.wire import DeviceRegistered, DeviceRevoked, DeviceRoster, RegisterDeviceRequest

MAX_LABEL_CHARS: Final = 128


@get("/v1/vaults/{vault_id:str}/devices", tags=["devices"])
async def list_devices(request: Request[Any, Any, Any], vault_id: FromPath[str]) -> DeviceRoster:
    """Every device that pushed, pulled or registered, newest first."""
    await authorize(request, require_id(vault_id, "vault_id"))
    devices = await store.roster(relay_state(request).require_pool(), vault_id)
    return DeviceRoster(vault_id=vault_id, devices=devices)


@post("/v1/vaults/{vault_id:str}/devices/register", status_code=200, tags=["devices"])
async def register_device(
    request: Request[Any, Any, Any], vault_id: FromPath[str], data: JSONBody[RegisterDeviceRequest]
) -> DeviceRegistered:
    """Label a device (both fields non-empty after trim, label <= 128 characters)."""
    principal = await authorize(request, require_id(vault_id, "vault_id"))
    device_id, label = data.device_id.strip(), data.label.strip()
    require_id(device_id, "device_id")
    if not label:
        raise bad_request("label is empty", code="invalid_request", field="label")
    if len(label) > MAX_LABEL_CHARS:
        raise bad_request(
            f"label is longer than {MAX_LABEL_CHARS} characters",
            code="invalid_request",
            field="label",
        )
    if principal.device_id is not None and principal.device_id != device_id:
        raise forbidden("this key is bound to another device")
    await store.register(relay_state(request).require_pool(), vault_id, device_id, label)
    return DeviceRegistered(vault_id=vault_id, device_id=device_id, label=label)


@delete("/v1/vaults/{vault_id:str}/devices/{device_id:str}", status_code=200, tags=["devices"])
async def revoke_device(
    request: Request[Any, Any, Any], vault_id: FromPath[str], device_id: FromPath[str]
) -> DeviceRevoked:
    """Revoke a device and every key bound to it (admin; idempotent)."""
    await authorize(request, require_id(vault_id, "vault_id"), admin=True)
    require_id(device_id, "device_id")
    await store.revoke(relay_state(request).require_pool(), vault_id, device_id)
    return DeviceRevoked(vault_id=vault_id, device_id=device_id)
