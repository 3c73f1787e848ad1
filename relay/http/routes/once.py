"""Exactly-once answers for the routes that create something (docs/retries.md).

A route that mints a key, opens an account, issues or redeems a pairing code or opens a
handoff request runs its writes through `Once.run`. Without an `Idempotency-Key` header that
is one transaction. With one, the first request under the key does the work and stores its
answer in the same transaction (relay.domain.idempotency_keys, relay.store.idempotency); a
repeat (the client's retry after a lost answer, or a concurrent duplicate) does nothing and
gets that same answer, for 24 hours.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import asyncpg
from litestar import Request

from engram_sync.relay.domain.idempotency_keys import HEADER, IdempotentRequest
from engram_sync.relay.http.app_state import relay_state
from engram_sync.relay.http.errors import RelayError
from engram_sync.relay.store import idempotency as store
from engram_sync.shared_format.wire import decode_json, encode_json

T = TypeVar("T")


class _TakenError(Exception):
    """Another request under the same key committed first."""


@dataclass(frozen=True)
class Once:
    """The request's idempotency key, if it sent one, for the route's one transaction."""

    pool: asyncpg.Pool
    request: IdempotentRequest | None

    @classmethod
    async def of(cls, request: Request[Any, Any, Any], *, scope: str) -> Once:
        """`scope` names who asks (an account, a key; "anonymous" for a sign-up), so two
        callers' keys never meet. InvalidIdempotencyKeyError for a malformed header."""
        pool = relay_state(request).require_pool()
        key = request.headers.get(HEADER)
        if key is None:
            return cls(pool, None)
        route = f"{request.method} {request.url.path}"
        body = await request.body()
        return cls(pool, IdempotentRequest.of(key, scope=scope, route=route, body=body))

    async def replay(self, answer_type: type[T]) -> T | None:
        """The first answer under this key, when there was one (`run` checks it too; call it
        first when the route has costly work to do before its transaction)."""
        if self.request is None:
            return None
        stored = await store.recall(self.pool, self.request)
        return None if stored is None else decode_json(stored, answer_type)

    async def run(
        self, answer_type: type[T], work: Callable[[asyncpg.Connection], Awaitable[T]]
    ) -> T:
        """The first answer under the key, if there was one; else `work` in one transaction,
        its answer stored with it under the key (if any)."""
        answer = await self.run_or_nothing(answer_type, work)
        if answer is None:  # work's type says it always answers
            raise TypeError(f"{answer_type.__name__} work answered nothing")
        return answer

    async def run_or_nothing(
        self, answer_type: type[T], work: Callable[[asyncpg.Connection], Awaitable[T | None]]
    ) -> T | None:
        """As `run`, for work that may make nothing and still has writes to keep (e.g. a
        redeem that erases an expired code): None commits the work and records nothing, so
        a repeat runs again (and finds nothing again)."""
        if self.request is None:
            async with self.pool.acquire() as conn, conn.transaction():
                return await work(conn)
        replayed = await self.replay(answer_type)
        if replayed is not None:
            return replayed
        try:
            async with self.pool.acquire() as conn, conn.transaction():
                if not await store.claim(conn, self.request):
                    raise _TakenError
                answer = await work(conn)
                if answer is None:
                    await store.release(conn, self.request)
                else:
                    await store.remember(conn, self.request, encode_json(answer))
                return answer
        except _TakenError:
            replayed = await self.replay(answer_type)
            if replayed is None:  # it expired, or made nothing, between that commit and this read
                raise RelayError(
                    409,
                    "idempotency_race",
                    f"a request with this {HEADER} was just completed and made nothing, or its "
                    "record expired: send the request again",
                ) from None
            return replayed
