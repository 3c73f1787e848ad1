"""CPU work done while the database answers a statement already sent (PROTOCOL §6, §18).

A push's Python work is done while the database answers rather than before or after:
§6 step 1's check of the pushed blobs while the stored versions are read
(`relay.store.push.checked_jobs`), and the digest's fold (the new versions' buckets and
hashes, the replaced versions' SHA-256, the XORs and the bucket prefixes,
`_fold_digests`) while the blobs are written (issue 36: the hashes were computed with the
read, where the check now runs). On one connection asyncio would otherwise leave the
relay idle while it waits for the answer, and the work would lengthen every push by its
full time (docs/digest.md, figure 12). A cursor pull's page is built the same way while
its progress is written (`relay.store.sync`, issue 36)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Coroutine
from typing import Any, TypeVar

T = TypeVar("T")
R = TypeVar("R")


async def while_answered(statement: Coroutine[Any, Any, T], work: Callable[[], R]) -> tuple[T, R]:
    """Send `statement`, run `work` while the database answers it, then wait for the answer.

    One pass of the event loop lets the statement's task write its request (asyncpg sends
    it before it first waits). Whatever `work` raises, the statement is waited for first,
    so the connection is never left with an operation in flight; the statement's own
    error, if any, is the one raised.
    """
    task = asyncio.ensure_future(statement)
    await asyncio.sleep(0)
    try:
        done = work()
    finally:
        answer = await task
    return answer, done
