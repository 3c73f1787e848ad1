"""The ASGI scope keys the server's connection guards (relay.serving.connections) and the
long-lived routes (relay.http.routes.events, relay.http.routes.feed_support) share: named
here, below both, so the routes need not import the serving layer."""

from __future__ import annotations

from typing import Final

# A scope key a long-lived response (an event stream, relay.http.routes.events) sets to a
# callable ending it: a graceful shutdown calls it instead of waiting out
# `timeout_graceful_shutdown` (10 s) and cancelling the response.
STOP_ON_SHUTDOWN: Final = "engram.stop_on_shutdown"
# A scope key the protocol sets (every request) to a callable that marks the connection as
# held by a long-lived response of the given holder names (relay.domain.stream_holders.Holder
# .names); the cap may close such a connection, the heaviest holder's oldest first.
HOLD_CONNECTION: Final = "engram.hold_connection"
