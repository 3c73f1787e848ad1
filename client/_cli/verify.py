"""`engram-sync verify [--repair] [--deep] [--json]` (PROTOCOL §18, docs/digest.md).

Compares this device's digest with the relay's and, on a mismatch, narrows it down by
bucket and says what differs. `--repair` runs a sync, whose anti-entropy check fetches
what the device lacks and pushes what the relay lacks (nothing is deleted because the
relay lacks it). `--deep` compares with the digest the relay computes from its rows
(`?deep=1`, feature `digest-deep`) instead of the running total it stores, so a row the
relay lost outside a push is seen (and, with `--repair`, pushed again). Exit 0 when the
two agree at the end, 1 on a mismatch not repaired.
"""

from __future__ import annotations

from dataclasses import asdict
from typing import TYPE_CHECKING, Annotated

import typer

from .support import CliError, err, open_session, out, print_json

if TYPE_CHECKING:  # the sync engine is imported where used (issue 17)
    from .._sync.reports import DigestReport


def verify(
    repair: Annotated[
        bool, typer.Option("--repair", help="Sync, fetching and pushing what differs.")
    ] = False,
    deep: Annotated[
        bool,
        typer.Option(
            "--deep", help="Compare with the digest the relay computes from its rows (slower)."
        ),
    ] = False,
    json_out: Annotated[bool, typer.Option("--json", help="JSON output.")] = False,
) -> None:
    """Check that this device and the relay hold the same versions (exit 1 if not)."""
    from .._sync.anti_entropy import DEEP_FEATURE, DIGEST_FEATURE, AntiEntropy
    from .._sync.reports import SyncReport

    with open_session() as session, session.relay() as relay:
        if not relay.offers(DIGEST_FEATURE):
            raise CliError(
                f"the relay at {relay.base_url} does not offer the digest (PROTOCOL §18): "
                "upgrade it to verify"
            )
        if deep and not relay.offers(DEEP_FEATURE):
            raise CliError(
                f"the relay at {relay.base_url} cannot compute the digest from its rows "
                "(no `digest-deep`): upgrade it, or run `engram-sync verify` without --deep"
            )
        if deep:
            syncer = session.syncer(relay, check_digest=False)
            report = syncer.sync() if repair else SyncReport()
            digest: DigestReport | None = AntiEntropy(syncer, report, deep=True).run(repair=repair)
        elif repair:
            digest = session.syncer(relay).sync().digest
        else:
            digest = session.syncer(relay, check_digest=False).anti_entropy(
                SyncReport(), repair=False
            )
    assert digest is not None  # the relay offers the digest, so the sync checked it
    if json_out:
        print_json(asdict(digest))
    else:
        _say(digest, repair)
    if not digest.matched:
        raise typer.Exit(1)


def _say(digest: DigestReport, repair: bool) -> None:
    if digest.kept_repaired:
        err.print("this device's kept digest disagreed with its rows: recomputed (issue 36)")
    if digest.matched and not digest.buckets:
        out.print(f"in agreement: {digest.device_count} version(s), digest {digest.relay_digest}")
        return
    out.print(
        f"{len(digest.buckets)} bucket(s) differed: the relay holds {digest.device_lacks} "
        f"version(s) this device lacks, this device {digest.relay_lacks} the relay lacks"
    )
    if repair:
        out.print(
            f"repaired: {digest.fetched} applied, {digest.restored} restored, "
            f"{digest.requeued} pushed again, {digest.compacted} compacted tombstone(s) noted"
        )
    if digest.unresolved:
        shown = ", ".join(digest.unresolved[:20])
        err.print(f"unresolved (nothing changed for them): {shown}", markup=False)
    if digest.matched:
        out.print("in agreement now")
    elif not repair:
        err.print("not in agreement: run `engram-sync verify --repair` (or `engram-sync sync`)")
    else:
        err.print("still not in agreement after the repair: see above")
