"""The refusals of the push and pull layers, as exceptions with no HTTP in them.

STYLE "Errors have one owner per layer": `relay.domain.push_rules`, `relay.services.push_groups` and
`relay.store` raise these; `relay.http.errors` alone answers each with its status, headers
and body (PROTOCOL §5). A store or rules function can then serve the CLI, a background
job or a test without pretending to be an HTTP handler. (The store's older domain
errors, e.g. `relay.store.devices.DeviceQuotaError`, live next to their store code and
are answered the same way.)
"""

from __future__ import annotations

from typing import Literal


class DomainError(Exception):
    """A refusal decided below the HTTP layer; `relay.http.errors` answers it."""


# --- per-process caps (relay.services.scan_gate, .passwords): nothing done, retry later ---


class BusyError(DomainError):
    """Refused at a per-process cap before any work was done (503 `busy` with Retry-After),
    so a device may send the request again as it was (the client's `NOT_PROCESSED`)."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


class ScanTimeoutError(DomainError):
    """A whole-vault scan the database stopped at its time bound (503 `scan_timeout` with
    Retry-After); nothing was changed, the statements only read."""

    def __init__(self, message: str, retry_after_s: int) -> None:
        super().__init__(message)
        self.message = message
        self.retry_after_s = retry_after_s


# --- PROTOCOL §6 step 1 (and the 1..1000 batch size of §5): the whole push, nothing written


class PushRefusedError(DomainError):
    """A push refused as a whole in its group's transaction; the others of the group go
    on. `relay.store.push` returns it in the push's place of the group's results."""


class InvalidBatchError(PushRefusedError):
    """The push as a whole is structurally invalid; nothing of it was written (a refusal
    like the others: its group's other pushes go on, relay.store.push)."""


class EmptyBatchError(InvalidBatchError):
    """A push with no blobs."""

    def __init__(self, max_blobs: int) -> None:
        super().__init__(f"empty batch: send 1 to {max_blobs} blobs")
        self.max_blobs = max_blobs


class BatchTooLargeError(InvalidBatchError):
    """More blobs in one push than a push may carry."""

    def __init__(self, count: int, max_blobs: int) -> None:
        super().__init__(f"{count} blobs in one push; at most {max_blobs}")
        self.count = count
        self.max_blobs = max_blobs


class InvalidBlobError(InvalidBatchError):
    """The first structurally invalid blob: its index in the batch, field and reason."""

    def __init__(self, index: int, field: str, reason: str) -> None:
        super().__init__(f"blob {index}: {reason}")
        self.index = index
        self.field = field  # the blob's field at fault, e.g. "hmac"
        self.reason = reason


# --- refusals of one push in its transaction (relay.store.push) --------------------------


class QuotaExceededError(PushRefusedError):
    """PROTOCOL §6: the accepted set would take the vault past a quota (`used` is the
    projected value)."""

    def __init__(self, detail: Literal["bytes", "devices"], limit: int, used: int) -> None:
        super().__init__(f"quota exceeded: {detail} would be {used}, the limit is {limit}")
        self.detail: Literal["bytes", "devices"] = detail
        self.limit = limit
        self.used = used


# --- the group commit (relay.services.push_groups) ------------------------------------------


class ShuttingDownError(DomainError):
    """The push waited in a lane that stopped (the relay is shutting down): retry."""

    def __init__(self) -> None:
        super().__init__("the relay is shutting down")


# --- pulls (relay.store.sync) ----------------------------------------------------------------


class ResyncRequiredError(DomainError):
    """PROTOCOL §9, §12: the pull's cursor (or origin) is behind the compaction horizon;
    the device must pull again from cursor 0 and reconcile."""

    def __init__(self, cursor: int, horizon: int) -> None:
        super().__init__(f"cursor {cursor} is behind the compaction horizon {horizon}")
        self.cursor = cursor
        self.horizon = horizon


# --- vault retirement (relay.store.retire, relay.store.push) ---------------------------------


class VaultRetiredError(PushRefusedError):
    """PROTOCOL §19: the vault was retired; pushes (and new keys, handoff requests and
    pairing codes, and every route once the grace period is over) are refused 410 with
    the successor the retire named (a hint: clients never trust it) and the successor
    statement the retire stored (§19: the follower checks it; opaque to the relay)."""

    def __init__(
        self,
        vault_id: str,
        successor: str | None,
        statement: str | None = None,
        stated_at: str | None = None,
    ) -> None:
        super().__init__(f"vault {vault_id} was retired")
        self.vault_id = vault_id
        self.successor = successor
        self.statement = statement
        self.stated_at = stated_at


class AlreadyRetiredError(DomainError):
    """PROTOCOL §19: a retire naming another successor than the one already stored (409)."""

    def __init__(self, vault_id: str, successor: str | None) -> None:
        super().__init__(f"vault {vault_id} was already retired")
        self.vault_id = vault_id
        self.successor = successor
