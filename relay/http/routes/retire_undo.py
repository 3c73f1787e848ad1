"""`DELETE /v1/vaults/{v}/retire`: the owner undoes a retire within the grace period
(PROTOCOL §19 with §13 "Only the owner may retire a vault"; docs/rekey.md "Undoing a
retire").

Owner only (an operator key, or an admin key of the owning account: 403 `owner_only` for
an admin grant, `admin_not_granted` for a member). Idempotent: `undone` is false when the
vault was not retired. Once `erase_after` has passed: 410 `vault_retired`.
"""

from __future__ import annotations

import logging
from typing import Any, Final

from litestar import Request, delete
from litestar.params import FromPath

from engram_sync.relay.http.app_state import relay_state
from engram_sync.relay.http.auth import authorize_owner
from engram_sync.relay.http.routes.ids import require_id
from engram_sync.relay.store.retire_undo import undo_retire
from engram_sync.shared_format.wire import RetireUndone

log = logging.getLogger(__name__)


@delete("/v1/vaults/{vault_id:str}/retire", status_code=200, tags=["retire"])
async def undo_retire_vault(
    request: Request[Any, Any, Any], vault_id: FromPath[str]
) -> RetireUndone:
    """Undo the vault's retire: pushes are accepted again (owner; before `erase_after`)."""
    principal = await authorize_owner(request, require_id(vault_id, "vault_id"), "undo its retire")
    undone = await undo_retire(relay_state(request).require_pool(), vault_id)
    if undone:
        log.info("vault retire undone", extra={"vault_id": vault_id, "key_id": principal.key_id})
    return RetireUndone(vault_id=vault_id, undone=undone)


ROUTES: Final = [undo_retire_vault]
