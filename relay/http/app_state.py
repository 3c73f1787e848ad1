"""The relay's process state (relay.services.state) as a route reaches it: from the app
serving the request. Here, in the HTTP layer, so the services import no Litestar."""

from __future__ import annotations

from typing import Any

from litestar import Request

from engram_sync.relay.services.state import RelayState


def relay_state(request: Request[Any, Any, Any]) -> RelayState:
    """The RelayState of the app serving this request."""
    state: RelayState = request.app.state.relay
    return state
