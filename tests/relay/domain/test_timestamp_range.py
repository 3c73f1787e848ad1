"""Timestamps RFC 3339 allows but the database cannot store (issue 14 item 11).

Python reads years 0001-9999 with any offset, but an instant whose UTC time falls
outside 0001-01-01..9999-12-31 overflows when asyncpg converts it to UTC. Such a value
used to pass validation and reach the database, whose failure became a 400 naming no
field; now it is refused up front, naming it (PROTOCOL §6 step 1: the whole push, with
the blob's index).
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta, timezone

import httpx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from engram_sync.relay.domain.instants import parse_storable
from tests.relay.conftest import Relay
from tests.relay.support import (
    Sealer,
    assert_error,
    client,
    module_relay_fixture,
    new_vault_id,
    pull,
    pull_all,
    push,
    push_ok,
)

# In UTC these fall before year 1 or after year 9999.
OVERFLOWING = (
    "0001-01-01T00:00:00+14:00",
    "0001-01-01T00:59:59.999999+01:00",
    "9999-12-31T23:59:59-14:00",
    "9999-12-31T23:00:00-01:00",
)
# The edges that still fit, next to them.
STORABLE = (
    "0001-01-01T00:00:00+00:00",
    "0001-01-01T01:00:00+01:00",
    "0001-01-01T00:00:00-14:00",
    "9999-12-31T23:59:59.999999+00:00",
    "9999-12-31T22:59:59-01:00",
    "9999-12-31T23:59:59+14:00",
)


relay = module_relay_fixture()


@pytest.fixture(scope="module")
def http(relay: Relay) -> Iterator[httpx.Client]:
    with client(relay) as c:
        yield c


@pytest.mark.parametrize("text", OVERFLOWING)
def test_parse_storable_refuses_an_instant_outside_the_utc_range(text: str) -> None:
    with pytest.raises(ValueError, match="out of range"):
        parse_storable(text)


@pytest.mark.parametrize("text", STORABLE)
def test_parse_storable_keeps_the_edges_that_fit(text: str) -> None:
    assert parse_storable(text).astimezone(UTC).year in (1, 9999)


@pytest.mark.parametrize("text", OVERFLOWING)
def test_a_push_with_an_overflowing_created_at_is_a_400_naming_the_blob_and_field(
    http: httpx.Client, text: str
) -> None:
    vault = new_vault_id()
    sealer = Sealer(vault)
    blobs = [sealer.blob("fine-0", 1), sealer.blob("fine-1", 1), sealer.blob("bad", 1,
             created_at=text)]  # fmt: skip
    body = assert_error(push(http, vault, blobs), 400, "invalid_blob")
    assert body["index"] == 2
    assert body["field"] == "blobs[2].created_at"
    assert body["reason"].startswith("created_at: ")
    assert "out of range" in body["reason"]
    assert "blob 2" in body["error"]
    assert pull_all(http, vault)[0] == []  # nothing of the batch was written


def test_the_edges_that_fit_are_stored_and_pulled_back_exactly(http: httpx.Client) -> None:
    vault = new_vault_id()
    sealer = Sealer(vault)
    blobs = [sealer.blob(f"edge-{i}", 1, created_at=t) for i, t in enumerate(STORABLE)]
    assert push_ok(http, vault, blobs)["accepted"] == len(STORABLE)
    pulled, _ = pull_all(http, vault)
    assert sorted(b["created_at"] for b in pulled) == sorted(STORABLE)


@pytest.mark.parametrize("text", OVERFLOWING)
def test_a_pull_since_an_overflowing_instant_is_a_400_naming_since(
    http: httpx.Client, text: str
) -> None:
    vault = new_vault_id()
    push_ok(http, vault, [Sealer(vault).blob("m", 1)])
    body = assert_error(pull(http, vault, since=text), 400, "invalid_request")
    assert body["field"] == "since"
    assert "out of range" in body["error"]


@pytest.mark.parametrize("text", STORABLE)
def test_a_pull_since_an_edge_that_fits_answers(http: httpx.Client, text: str) -> None:
    vault = new_vault_id()
    push_ok(http, vault, [Sealer(vault).blob("m", 1, created_at="2026-08-30T12:00:00+00:00")])
    response = pull(http, vault, since=text)
    assert response.status_code == 200, response.text
    expected = 0 if parse_storable(text).year == 9999 else 1
    assert len(response.json()["blobs"]) == expected


def _rfc3339(moment: datetime, offset_minutes: int) -> str:
    sign = "+" if offset_minutes >= 0 else "-"
    hours, minutes = divmod(abs(offset_minutes), 60)
    wall = f"{moment.year:04d}" + moment.strftime("-%m-%dT%H:%M:%S.%f")  # %Y: no padding
    return wall + f"{sign}{hours:02d}:{minutes:02d}"


# Wall-clock times near both ends of Python's range, with any offset RFC 3339 allows.
near_the_ends = st.one_of(
    st.datetimes(min_value=datetime(1, 1, 1), max_value=datetime(1, 1, 2)),
    st.datetimes(min_value=datetime(9999, 12, 30), max_value=datetime(9999, 12, 31, 23, 59)),
)


@settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(moment=near_the_ends, offset=st.integers(min_value=-(23 * 60 + 59), max_value=23 * 60 + 59))
def test_any_timestamp_near_the_ends_is_stored_or_refused_naming_it(
    http: httpx.Client, moment: datetime, offset: int
) -> None:
    """Never a 500 nor the database's nameless 400: accepted exactly when its UTC
    instant fits, else a 400 with the field."""
    text = _rfc3339(moment, offset)
    fits = True
    try:
        moment.replace(tzinfo=timezone(timedelta(minutes=offset))).astimezone(UTC)
    except OverflowError:
        fits = False
    vault = new_vault_id()
    response = push(http, vault, [Sealer(vault).blob("m", 1, created_at=text)])
    if fits:
        assert response.status_code == 200, (text, response.text)
        assert pull_all(http, vault)[0][0]["created_at"] == text
    else:
        body = assert_error(response, 400, "invalid_blob")
        assert body["field"] == "blobs[0].created_at", (text, body)
    since = pull(http, vault, since=text)
    if fits:
        assert since.status_code == 200, (text, since.text)
    else:
        assert assert_error(since, 400, "invalid_request")["field"] == "since"
