"""The anti-entropy digest and the fetch of current versions (PROTOCOL §18, docs/digest.md).

`GET /v1/vaults/{v}/digest` (auth as pull) answers `{"cursor","count","digest"}` for the
vault (stored, O(1)); `?bucket=B` for one bucket and `?bucket=B&list=1[&after=M]` its
versions a page at a time (computed on request over that bucket's rows); `?buckets=1`
every bucket's prefix and count at once (ours, stored on the vault row: O(1)); `&deep=1`
(ours, feature `digest-deep`) the vault's or every bucket's computed from the rows instead
of the stored totals (a pass over the whole vault, through the scan gate).
`POST /v1/vaults/{v}/digest/narrow {"bucket", "subs"[, "after"]}` (ours) narrows one bucket
by its 256 sub-buckets: the versions of those whose digests differ from the device's.
`POST /v1/vaults/{v}/fetch {"memory_ids": [...]}` (ours) gives the current blobs of the
memories a device found it lacks.
"""

from __future__ import annotations

from typing import Annotated, Any

from litestar import Request, get, post
from litestar.params import FromPath, QueryParameter
from msgspec.structs import replace

from engram_sync.relay.domain.api_keys import Principal
from engram_sync.relay.domain.scan_admission import ScanClaim
from engram_sync.relay.http.app_state import relay_state
from engram_sync.relay.http.bodies import BODY_OPT, decode_body
from engram_sync.relay.http.client_ip import client_ip
from engram_sync.relay.http.errors import bad_request
from engram_sync.relay.http.routes.ids import require_id
from engram_sync.relay.http.routes.retire import authorize_until_erased
from engram_sync.relay.store import digest as store
from engram_sync.shared_format.b64 import Base64Error, b64decode_std, b64encode_std
from engram_sync.shared_format.digest import (
    BUCKETS,
    MAX_FETCH_IDS,
    MAX_LIST_PAGE,
    MAX_NARROW_BODY,
    MAX_NARROW_PAGE,
    PREFIX_BYTES,
    SUB_BUCKETS,
    DigestAnswer,
    DigestEntry,
    FetchRequest,
    FetchResponse,
    NarrowAnswer,
    NarrowRequest,
    digest_text,
)

Flag = Annotated[int, QueryParameter(ge=0, le=1)]


def scan_claim(request: Request[Any, Any, Any], vault_id: str, principal: Principal) -> ScanClaim:
    """A whole-vault scan's claim (PROTOCOL §18; relay.domain.scan_admission): its vault, key,
    account and client address (X-Forwarded-For believed only from trusted proxies)."""
    return ScanClaim.of(vault_id, principal.key_id, principal.account_id, client_ip(request))


@get("/v1/vaults/{vault_id:str}/digest", tags=["sync"])
async def digest(
    request: Request[Any, Any, Any],
    vault_id: FromPath[str],
    bucket: Annotated[int | None, QueryParameter(ge=0, le=BUCKETS - 1)] = None,
    list_: Annotated[int, QueryParameter(name="list", ge=0, le=1)] = 0,
    buckets: Flag = 0,
    deep: Flag = 0,
    after: Annotated[str, QueryParameter(max_length=256)] = "",
    limit: Annotated[int, QueryParameter(ge=0, le=MAX_LIST_PAGE)] = 0,
) -> DigestAnswer:
    """The vault's digest, one bucket's, one bucket's list, or every bucket's (§18)."""
    state = relay_state(request)
    principal = await authorize_until_erased(request, require_id(vault_id, "vault_id"))  # §19
    pool = state.require_pool()
    _check_digest_query(bucket, list_=list_, buckets=buckets, deep=deep, paged=bool(after or limit))
    if deep:  # ours: from the rows, not the stored totals (a whole-vault pass: gated)
        scans = state.require_scans()
        async with scans.admit(scan_claim(request, vault_id, principal)):
            seq, found = await store.bucket_digests(scans.reader(pool), vault_id, None)
        folded = store.fold_buckets(found)
        answer = DigestAnswer(cursor=seq, count=folded.count, digest=digest_text(folded.digest))
        if not buckets:
            return answer
        return replace(answer, buckets=b64encode_std(folded.prefixes), counts=folded.counts)
    if bucket is None and not buckets:
        whole = await store.vault_digest(pool, vault_id)
        text = digest_text(whole.digest)
        return DigestAnswer(cursor=whole.cursor, count=whole.count, digest=text)
    if buckets:  # stored (revision 0012): one row read, one snapshot
        stored = await store.stored_buckets(pool, vault_id)
        return DigestAnswer(
            cursor=stored.cursor,
            count=sum(stored.counts),
            digest=digest_text(stored.digest),
            buckets=b64encode_std(stored.prefixes),
            counts=stored.counts,
        )
    assert bucket is not None
    scans = state.require_scans()  # passes over the whole vault: bounded (relay.services.scan_gate)
    reader = scans.reader(pool)
    async with scans.admit(scan_claim(request, vault_id, principal)):
        seq, found = await store.bucket_digests(reader, vault_id, bucket)
        mine = found.get(bucket)
        answer = DigestAnswer(
            cursor=seq,
            count=mine.count if mine else 0,
            digest=digest_text(mine.digest if mine else 0),
            bucket=bucket,
        )
        if not list_:
            return answer
        page = await store.bucket_list(reader, vault_id, bucket, after, limit or MAX_LIST_PAGE)
    entries = [DigestEntry(*v) for v in page.versions]
    return replace(answer, entries=entries, has_more=page.has_more)


def _check_digest_query(
    bucket: int | None, *, list_: int, buckets: int, deep: int, paged: bool
) -> None:
    """400 for a combination of the digest route's parameters that asks two things at once."""
    if list_ and bucket is None:
        raise bad_request("list=1 needs bucket=B (0..255)", code="invalid_request", field="list")
    if buckets and bucket is not None:
        raise bad_request(
            "buckets=1 answers every bucket: leave bucket out", code="invalid_request",
            field="buckets",
        )  # fmt: skip
    if paged and not list_:
        raise bad_request("after and limit go with list=1", code="invalid_request", field="after")
    if deep and bucket is not None:
        raise bad_request(
            "deep=1 is for the vault's digest or buckets=1: one bucket is always computed "
            "from the rows, leave deep out", code="invalid_request", field="deep",
        )  # fmt: skip


@post(
    "/v1/vaults/{vault_id:str}/digest/narrow",
    status_code=200,
    tags=["sync"],
    opt={BODY_OPT: NarrowRequest},
    request_max_body_size=MAX_NARROW_BODY,
)
async def narrow(request: Request[Any, Any, Any], vault_id: FromPath[str]) -> NarrowAnswer:
    """One bucket narrowed by sub-bucket (ours, docs/digest.md): given the device's first
    8 bytes of each of its 256 sub-bucket digests, the versions of the sub-buckets whose
    digests differ, a page at a time. Auth as pull; one statement, one snapshot."""
    state = relay_state(request)
    principal = await authorize_until_erased(request, require_id(vault_id, "vault_id"))  # §19
    data = await decode_body(request, NarrowRequest)
    try:
        prefixes = b64decode_std(data.subs)
    except Base64Error:
        prefixes = b""
    if len(prefixes) != SUB_BUCKETS * PREFIX_BYTES:
        raise bad_request(
            f"subs must be standard base64 of exactly {SUB_BUCKETS} x {PREFIX_BYTES} bytes",
            code="invalid_request", field="subs",
        )  # fmt: skip
    scans = state.require_scans()  # a pass over the whole vault: bounded (relay.services.scan_gate)
    async with scans.admit(scan_claim(request, vault_id, principal)):
        found = await store.narrow(
            scans.reader(state.require_pool()),
            vault_id, data.bucket, prefixes, data.after, MAX_NARROW_PAGE,
        )  # fmt: skip
    return NarrowAnswer(
        cursor=found.bucket.cursor,
        count=found.bucket.count,
        digest=digest_text(found.bucket.digest),
        bucket=data.bucket,
        subs=found.subs,
        entries=[DigestEntry(*v) for v in found.versions],
        has_more=found.has_more,
    )


@post(
    "/v1/vaults/{vault_id:str}/fetch", status_code=200, tags=["sync"], opt={BODY_OPT: FetchRequest}
)
async def fetch(request: Request[Any, Any, Any], vault_id: FromPath[str]) -> FetchResponse:
    """The current blob of each memory id asked for (at most 1000), within the page byte
    cap (`has_more`: ask again for the rest). Auth as pull (docs/digest.md)."""
    state = relay_state(request)
    await authorize_until_erased(request, require_id(vault_id, "vault_id"))  # PROTOCOL §19
    data = await decode_body(request, FetchRequest)
    if not data.memory_ids:
        raise bad_request("memory_ids is empty", code="invalid_request", field="memory_ids")
    if len(data.memory_ids) > MAX_FETCH_IDS:
        raise bad_request(
            f"at most {MAX_FETCH_IDS} memory_ids per fetch", code="invalid_request",
            field="memory_ids",
        )  # fmt: skip
    for memory_id in data.memory_ids:
        require_id(memory_id, "memory_ids")
    found = await store.fetch_current(
        state.require_pool(), vault_id, data.memory_ids, state.config.max_page_bytes
    )
    return FetchResponse(blobs=found.blobs, has_more=found.has_more)
