"""The client drops idle connections before the relay closes them.

With both at 5 s, a request sent just as the relay closed an idle connection failed with
"connection reset" (1 of 200 requests after 4.97-5.03 s idle in a reproduction; a full
convergence run failed on it, since that test's client does not retry). The client's
retries hide it in normal use, but each costs a backoff.
"""

from __future__ import annotations

import uvicorn

from engram_sync.client._http.relay_client import KEEPALIVE_EXPIRY_S
from engram_sync.relay.serving.connections import ConnectionLimits
from engram_sync.relay.serving.server import KEEP_ALIVE_S, _uvicorn_config


def test_the_client_lets_idle_connections_go_before_the_relay_does() -> None:
    served = _uvicorn_config(
        "engram_sync.relay.serving.server:app_from_env",
        "127.0.0.1",
        0,
        limits=ConnectionLimits(),
        factory=True,
    )
    assert served.timeout_keep_alive == KEEP_ALIVE_S
    assert KEEPALIVE_EXPIRY_S <= KEEP_ALIVE_S - 1  # a second of margin for a busy relay
    # the in-process relay of the tests serves with uvicorn's default, the same value
    assert uvicorn.Config("x").timeout_keep_alive == KEEP_ALIVE_S
