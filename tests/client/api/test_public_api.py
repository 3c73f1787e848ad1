"""engram_sync.client's public API (issue 19): a small pinned surface, private modules
behind it, and `Vault` doing what its docstrings say against a real relay and vault."""

from __future__ import annotations

import importlib
import logging
import pkgutil
import threading
from pathlib import Path

import pytest

import engram_sync.client as api
from engram_sync.client import NotLinkedError, RelayUnavailableError, SyncReport, Vault
from tests.relay.conftest import ADMIN_KEY, Relay

PASSPHRASE = "public api correct horse battery staple"

PUBLIC = [
    "AnswerTooLargeError",
    "AuthError",
    "DeviceRevokedError",
    "ForbiddenError",
    "HistoryError",
    "Layer",
    "Link",
    "LiveStatus",
    "Memory",
    "NotLinkedError",
    "OutcomeUnknownError",
    "Progress",
    "ProtocolError",
    "QuotaExceededError",
    "RateLimitedError",
    "RekeyError",
    "RekeyReport",
    "RelayError",
    "RelayMisbehavedError",
    "RelayUnavailableError",
    "ResyncRequiredError",
    "Retention",
    "RevertPlan",
    "SyncError",
    "SyncReport",
    "Vault",
    "VaultError",
    "VaultRetiredError",
    "VaultStatus",
    "Version",
    "Writer",
    "WrongPassphraseError",
    "__version__",
]


def test_the_public_names_are_pinned_and_all_importable() -> None:
    assert sorted(api.__all__) == PUBLIC
    for name in api.__all__:
        assert getattr(api, name) is not None
    errors = [getattr(api, n) for n in PUBLIC if n.endswith("Error") and n != "VaultError"]
    sync_errors = [e for e in errors if issubclass(e, api.SyncError)]
    # every client error is a SyncError; the two vault-file errors come from the format
    assert sorted(e.__name__ for e in set(errors) - set(sync_errors)) == ["WrongPassphraseError"]


def test_every_other_module_of_the_client_is_private() -> None:
    found = [m.name for m in pkgutil.walk_packages(api.__path__, "engram_sync.client.")]
    assert len(found) > 20  # the walk sees the whole package
    public = [name for name in found if not name.split(".")[2].startswith("_")]
    assert public == [], public
    # the positive case next to it: the private modules import, behind the public names
    assert importlib.import_module("engram_sync.client._sync.engine").SyncReport is SyncReport


def test_a_vault_adds_gets_lists_searches_edits_and_deletes(tmp_path: Path) -> None:
    with Vault.open(tmp_path / "v", PASSPHRASE, create=True) as vault:
        first = vault.add("Deploy with make ship", tags=["ops"], project="infra")
        second = vault.add("Lunch is at noon on Fridays", layer="semantic")
        memory = vault.get(first)
        assert memory is not None
        assert (memory.content, memory.tags, memory.project) == (
            "Deploy with make ship",
            ["ops"],
            "infra",
        )
        assert [m.id for m in vault.list()] == [first, second]
        assert [m.id for m in vault.search("deploy")] == [first]
        assert [m.id for m in vault.search("ship make")] == [first]  # every word, any order
        # no memory has every word: then any word will do (docs/search.md)
        assert {m.id for m in vault.search("deploy lunch")} == {first, second}
        assert [m.id for m in vault.search("lunch", layer="semantic")] == [second]
        assert vault.search("lunch", layer="episodic") == []
        assert [m.id for m in vault.search("deploy", tags=["ops"], project="infra")] == [first]
        assert vault.search("deploy", tags=["ops", "other"]) == []  # every tag given
        assert vault.search("") == []
        assert vault.search('AND "(* content:') == []  # FTS syntax is plain text here
        assert vault.edit(first, "Deploy with make ship-it")
        assert [m.id for m in vault.search("ship-it")] == [first]
        assert vault.edit(first, tags=["ops", "release"], project="platform", layer="semantic")
        edited = vault.get(first)
        assert edited is not None
        assert (edited.tags, edited.project, edited.layer) == (
            ["ops", "release"], "platform", "semantic")  # fmt: skip
        assert [m.id for m in vault.search("deploy", tags=["release"], project="platform")] == [
            first
        ]
        with pytest.raises(ValueError, match="layer"):
            vault.edit(first, layer="dream")  # type: ignore[arg-type]
        with pytest.raises(ValueError, match="nothing to change"):
            vault.edit(first)
        assert vault.delete(second)
        assert vault.get(second) is None
        assert not vault.delete(second)
        assert not vault.edit("no-such-id", "text")
        with pytest.raises(ValueError, match="empty"):
            vault.add("   ")
    # what was written is in the file: a second open reads it back
    with Vault.open(tmp_path / "v", PASSPHRASE) as again:
        assert [m.content for m in again.list()] == ["Deploy with make ship-it"]


def test_writes_with_provenance_links_recent_and_status(tmp_path: Path) -> None:
    """What a program writing for an AI tool needs (issue 33, docs/mcp.md): the source and
    context of a memory, the tool as the writer of edits and deletions, links, the newest
    memories and where the vault stands."""
    tool = {"tool": {"name": "claude-code", "version": "2.1"}}
    with Vault.open(tmp_path / "v", PASSPHRASE, create=True) as vault:
        assert Vault.open_unlocked(tmp_path / "v") is None  # no agent holds it
        first = vault.add("Deploy with make ship", source="ai-tool", context=tool, scope="rule")
        second = vault.add("The staging box is flaky", project="infra")
        memory = vault.get(first)
        assert memory is not None
        assert (memory.source, memory.context, memory.scope) == ("ai-tool", tool, "rule")
        assert vault.link_memories(second, first, "causal")
        assert [(k.target_id, k.link_type) for k in vault.get(second).links] == [  # type: ignore[union-attr]
            (first, "causal")
        ]
        assert not vault.link_memories(second, "no-such-id")
        assert [m.id for m in vault.recent(1)] == [second]  # the link is its newest version
        assert [m.id for m in vault.recent(5, project="infra")] == [second]
        assert vault.edit(second, "rewritten", source="ai-tool", tool="claude-code")
        assert vault.delete(first, source="ai-tool", tool="claude-code")
        writers = [v.replaced_by for v in vault.history(second) if v.replaced_by is not None]
        assert [(w.source, w.tool) for w in writers] == [("user", None), ("ai-tool", "claude-code")]
        vault.add("local only", privacy_level="strict_local")
        status = vault.status()
        assert isinstance(status, api.VaultStatus)
        assert (status.relay, status.vault_id, status.last_sync_at) == (None, None, None)
        assert (status.pending_pushes, status.pending_tombstones, status.local_only) == (1, 1, 1)
        for bad in [
            lambda: vault.add("x", source="a-robot"),
            lambda: vault.add("x", scope="forever"),
            lambda: vault.link_memories(first, second, "sideways"),  # type: ignore[arg-type]
            lambda: vault.link_memories(second, second),
            lambda: vault.recent(0),
        ]:
            with pytest.raises(ValueError):
                bad()


def test_the_wrong_passphrase_is_refused_and_nothing_is_written(tmp_path: Path) -> None:
    with Vault.open(tmp_path / "v", PASSPHRASE, create=True) as vault:
        vault.add("kept")
    before = (tmp_path / "v" / "engrams.db").read_bytes()
    with pytest.raises(api.WrongPassphraseError):
        Vault.open(tmp_path / "v", "not the passphrase")
    assert (tmp_path / "v" / "engrams.db").read_bytes() == before


def test_two_vaults_sync_through_a_relay(tmp_path: Path, relay: Relay) -> None:
    with Vault.open(tmp_path / "a", PASSPHRASE, create=True) as a:
        with pytest.raises(NotLinkedError):
            a.sync()
        vault_id = a.link(relay.url, ADMIN_KEY, vault_id="api-notes", label="a")
        assert (vault_id, a.vault_id) == ("api-notes", "api-notes")
        memory_id = a.add("synced through the public API")
        phases: list[str] = []
        report = a.sync(progress=lambda phase, _: phases.append(phase))
        assert report.pushed == 1
        assert "push" in phases
    with Vault.open(tmp_path / "b", PASSPHRASE, create=True) as b:
        b.link(relay.url, ADMIN_KEY, vault_id="api-notes", label="b")
        assert b.sync().applied == 1
        got = b.get(memory_id)
        assert got is not None
        assert got.content == "synced through the public API"


def test_watch_yields_a_report_per_round_until_stopped(tmp_path: Path, relay: Relay) -> None:
    stop = threading.Event()
    with Vault.open(tmp_path / "w", PASSPHRASE, create=True) as vault:
        vault.link(relay.url, ADMIN_KEY, vault_id="api-watch", label="w")
        vault.add("one")
        rounds = []
        for report in vault.watch(interval=0.01, stop=stop):
            rounds.append(report)
            if len(rounds) == 1:
                vault.add("two")  # written between rounds, pushed by the next one
            if len(rounds) == 3:
                stop.set()
        assert [r.pushed for r in rounds] == [1, 1, 0]
        with pytest.raises(ValueError, match="positive"):
            next(vault.watch(interval=0))


def test_watch_retries_an_unreachable_relay_and_ends_on_other_errors(
    tmp_path: Path, relay: Relay, caplog: pytest.LogCaptureFixture
) -> None:
    with Vault.open(tmp_path / "u", PASSPHRASE, create=True) as vault:
        vault.link(relay.url, ADMIN_KEY, vault_id="api-down", label="u")
        # the same vault pointed at a port nothing listens on: every round fails to connect
        vault._session.config.server_url = "http://127.0.0.1:9"
        stop = threading.Event()
        offline: list[api.LiveStatus] = []

        def on_status(status: api.LiveStatus) -> None:
            if status.state == "offline":
                offline.append(status)
                if len(offline) == 2:
                    stop.set()

        with caplog.at_level(logging.WARNING, logger="engram_sync.client._flows.live"):
            assert list(vault.watch(interval=0.01, stop=stop, on_status=on_status)) == []
        assert len(offline) == 2
        assert all("could not be reached" in (s.problem or "") for s in offline)
        assert sum("sync failed, retrying" in r.getMessage() for r in caplog.records) == 2
        # not retried: a refusal of the key ends the watch with its error
        vault._session.config.server_url = relay.url
        vault._session.config.api_key = "en_not-a-key-the-relay-knows"
        with pytest.raises(api.AuthError):
            next(vault.watch(interval=0.01))
    assert issubclass(api.AuthError, api.SyncError)
    assert not issubclass(api.AuthError, RelayUnavailableError)
