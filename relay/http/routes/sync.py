"""Push, pull and stats (PROTOCOL §5, §6, §7, §9)."""

from __future__ import annotations

import re
from typing import Annotated, Any, cast

from litestar import Request, get, post
from litestar.params import FromPath, FromQuery, QueryParameter
from msgspec import UNSET, UnsetType

from engram_sync.relay.domain.api_keys import Principal
from engram_sync.relay.domain.instants import parse_storable
from engram_sync.relay.domain.push_rules import check_count
from engram_sync.relay.http.app_state import relay_state
from engram_sync.relay.http.auth import authorize
from engram_sync.relay.http.bodies import BODY_OPT, decode_body
from engram_sync.relay.http.errors import bad_request
from engram_sync.relay.http.routes.feed_support import listener_of
from engram_sync.relay.http.routes.ids import require_id
from engram_sync.relay.http.routes.long_poll import MAX_WAIT_S, held_pull
from engram_sync.relay.http.routes.retire import authorize_until_erased
from engram_sync.relay.services.state import RelayState
from engram_sync.relay.store import sync as store
from engram_sync.relay.store.carried_digest import on_wire as carried_on_wire
from engram_sync.relay.store.push import PushJob
from engram_sync.relay.store.retire import Retirement
from engram_sync.shared_format.timestamps import format_rfc3339
from engram_sync.shared_format.wire import (
    DEFAULT_PULL_LIMIT,
    MAX_BLOBS_PER_PUSH,
    MAX_PULL_LIMIT,
    PullResponse,
    PushRequest,
    PushResponse,
    VaultRetirement,
    VaultStats,
)

DEVICE_HEADER = "x-engram-device"
# A `+` in an unencoded query string arrives as a space: "…12:00:00 00:00" → "+00:00".
_SPACE_OFFSET = re.compile(r" (\d{2}:\d{2})$")


@post(
    "/v1/vaults/{vault_id:str}/push",
    status_code=200,
    tags=["sync"],
    opt={BODY_OPT: PushRequest},
)
async def push(
    request: Request[Any, Any, Any],
    vault_id: FromPath[str],
    digest: Annotated[bool, QueryParameter()] = False,
) -> PushResponse:
    """Store a batch of blobs: one transaction, serialised per vault (PROTOCOL §6),
    shared with the pushes that arrive together (group commit, relay.services.push_groups).
    `digest=1` (ours, feature `digest-carried`): the answer carries the vault's §18 digest
    as the commit left it (relay.store.carried_digest); without it the §5 answer as was."""
    state = relay_state(request)
    principal = await authorize(request, require_id(vault_id, "vault_id"))
    data = await decode_body(request, PushRequest)
    check_count(data.blobs, MAX_BLOBS_PER_PUSH)  # §5; each blob's §6 step 1 in its group
    outcome = await state.require_push_groups().push(
        PushJob.of_request(vault_id, data.blobs, principal.device_id)
    )
    plan = outcome.plan
    state.metrics.pushes.inc()
    state.metrics.blobs_accepted.inc(len(plan.accepted))
    for reason, count in plan.reasons.items():
        state.metrics.blobs_rejected.labels(reason).inc(count)
    return PushResponse(
        accepted=len(plan.accepted),
        rejected=plan.rejected,
        revoked_devices=plan.revoked_devices,
        cursor=outcome.cursor,
        generation=state.generation,  # PROTOCOL §17, cached: no query of its own
        vault_digest=carried_on_wire(outcome.carried if digest else None),  # ours
    )


def retired_field(retired: Retirement | None) -> VaultRetirement | UnsetType:
    """PROTOCOL §19: `retired` of a pull of a retired vault; absent (UNSET) on a live one,
    so a live vault's pull answer is the §5 core byte for byte."""
    if retired is None:
        return UNSET
    if retired.statement is None or retired.stated_at is None:
        return VaultRetirement(retired.successor, format_rfc3339(retired.erase_after))
    return VaultRetirement(  # §19: the successor statement, for the follower to check
        retired.successor,
        format_rfc3339(retired.erase_after),
        statement=retired.statement,
        stated_at=retired.stated_at,
    )


def device_for_progress(request: Request[Any, Any, Any], bound: str | None) -> str | None:
    """The device a request speaks for: the key's bound device, else `X-Engram-Device`."""
    if bound is not None:
        return bound
    header = request.headers.get(DEVICE_HEADER)
    if header is None:
        return None
    return require_id(header, "X-Engram-Device")


@get("/v1/vaults/{vault_id:str}/pull", tags=["sync"])
async def pull(
    request: Request[Any, Any, Any],
    vault_id: FromPath[str],
    since: FromQuery[str | None] = None,
    limit: Annotated[int | None, QueryParameter(ge=0)] = None,
    cursor: Annotated[int | None, QueryParameter(ge=0, le=2**63 - 1)] = None,
    origin: Annotated[int | None, QueryParameter(ge=0, le=2**63 - 1)] = None,
    wait: Annotated[float | None, QueryParameter(gt=0, le=MAX_WAIT_S)] = None,
    digest: Annotated[bool, QueryParameter()] = False,
) -> PullResponse:
    """Legacy `since` mode (§7) or the commit-ordered `cursor` mode (§9).

    `limit` defaults to 1000 and is capped at 1000; `limit=0` means the default,
    so it can never answer an empty page that claims `has_more` forever. A cursor
    page's ciphertext also stays within `max_page_bytes` (at least one blob; a legacy
    page may pass it by its last blob: relay.store.sync).
    `origin` (additive, docs/pull-origin.md): the cursor this pull began at, against
    which the compaction horizon is checked. `wait=S` (0 < S <= 60, cursor mode only):
    with nothing beyond the cursor, hold the answer until a commit or S seconds (§15).
    `digest=1` (ours, cursor mode, feature `digest-carried`): a last page at the vault's
    head carries its §18 digest (relay.store.carried_digest).
    """
    state = relay_state(request)
    principal = await authorize(request, require_id(vault_id, "vault_id"))
    page_size = min(limit or DEFAULT_PULL_LIMIT, MAX_PULL_LIMIT)
    if cursor is not None:
        return await _pull_by_cursor(
            request, state, principal, vault_id, cursor, page_size,
            origin=origin, wait=wait, digest=digest,
        )  # fmt: skip
    if wait is not None:
        raise bad_request(
            "wait: a long-poll needs the cursor form of pull (`cursor=N&wait=S`)",
            code="invalid_request",
            field="wait",
        )
    instant = None
    if since:
        try:
            instant = parse_storable(_SPACE_OFFSET.sub(r"+\1", since))
        except ValueError as exc:
            raise bad_request(f"since: {exc}", code="invalid_request", field="since") from None
    blobs, has_more, retired = await store.pull_since(
        state.require_pool(), vault_id, instant, page_size, max_bytes=state.config.max_page_bytes
    )
    state.metrics.pulls.labels("since").inc()
    state.metrics.blobs_pulled.inc(len(blobs))
    return PullResponse(
        blobs=blobs,
        has_more=has_more,
        generation=state.generation,
        retired=retired_field(retired),
    )


async def _pull_by_cursor(
    request: Request[Any, Any, Any],
    state: RelayState,
    principal: Principal,
    vault_id: str,
    cursor: int,
    page_size: int,
    *,
    origin: int | None,
    wait: float | None,
    digest: bool = False,
) -> PullResponse:
    """The cursor mode (§9): one page, or with `wait` one held until a commit (§15)."""
    pool = state.require_pool()
    device = device_for_progress(request, principal.device_id)
    plain = state.push_limits is not None and state.push_limits.one_statement

    async def one_page() -> store.Page:
        return await store.pull_by_cursor(
            pool,
            vault_id,
            cursor,
            page_size,
            device,
            max_bytes=state.config.max_page_bytes,
            origin=origin,
            named=principal.device_id is None,  # PROTOCOL §12: a header proves nothing
            at_once=plain,  # plain PostgreSQL: the progress in one round trip
        )

    if wait is None or not state.config.feed_notify:  # ENGRAM_RELAY_LIVE_FEED=off
        page = await one_page()
    else:
        listener = listener_of(request, state, vault_id, device, principal)
        scope = cast(dict[str, Any], request.scope)
        page = await held_pull(state, listener, cursor, wait, one_page, scope)
    state.metrics.pulls.labels("cursor").inc()
    state.metrics.blobs_pulled.inc(len(page.blobs))
    state.metrics.pull_lag.observe(page.lag)
    return PullResponse(
        blobs=page.blobs,
        has_more=page.has_more,
        cursor=page.cursor,
        generation=state.generation,  # PROTOCOL §17, cached: no query of its own
        head=page.head,
        retired=retired_field(page.retired),
        vault_digest=carried_on_wire(page.carried if digest else None),  # §18 at the head
    )


async def _stats(request: Request[Any, Any, Any], vault_id: FromPath[str]) -> VaultStats:
    state = relay_state(request)
    await authorize_until_erased(request, require_id(vault_id, "vault_id"))  # §19
    total, latest = await store.vault_stats(state.require_pool(), vault_id)
    return VaultStats(vault_id=vault_id, total_blobs=total, latest_sync=latest)


@get("/v1/vaults/{vault_id:str}/stats", tags=["sync"])
async def stats(request: Request[Any, Any, Any], vault_id: FromPath[str]) -> VaultStats:
    """Live blob count and newest created_at (PROTOCOL §5)."""
    return await _stats(request, vault_id)


@get("/sync/{vault_id:str}/stats", tags=["sync"])
async def stats_alias(request: Request[Any, Any, Any], vault_id: FromPath[str]) -> VaultStats:
    """Alias of the stats route; existing daemons probe this path (PROTOCOL §5)."""
    return await _stats(request, vault_id)
