"""Ids taken from a request's path, header or body: a 400 naming the field when invalid.

The check itself (`shared_format.ids.check_id`, PROTOCOL §6 step 1) knows nothing of HTTP, so
the store and rules layers can use it; only this edge turns its answer into a 400.
"""

from __future__ import annotations

from engram_sync.relay.http.errors import bad_request
from engram_sync.shared_format.ids import check_id


def require_id(value: str, name: str) -> str:
    """`value` if valid, else a 400 naming the field."""
    problem = check_id(value, name)
    if problem:
        raise bad_request(problem, code="invalid_request", field=name)
    return value
