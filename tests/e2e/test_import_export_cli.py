"""`engram-sync export` / `import` through the real executable, on real SQLCipher vaults
(and a real relay where a sync is involved): the round trip keeps every column, duplicates
and bad lines are reported, imported memories are pushed by the next sync."""

from __future__ import annotations

import json
import os
import struct
import subprocess
import sys
from pathlib import Path
from typing import Any

from engram_sync.client._session import VaultSession
from engram_sync.client._vault import store
from engram_sync.shared_format.vault import open_vault
from tests.e2e.helpers import stderr_on_a_terminal
from tests.relay.conftest import ADMIN_KEY, Relay

EXE = str(Path(sys.executable).parent / "engram-sync")
PASSPHRASE = "import export correct horse battery staple"


def cli(
    vault: Path, *args: str, stdin: str | None = None, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    full_env = dict(os.environ, ENGRAM_PASSPHRASE=PASSPHRASE, **(env or {}))
    full_env.pop("ENGRAM_VAULT", None)
    return subprocess.run(
        [EXE, "--vault", str(vault), *args],
        input=stdin,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def ok(result: subprocess.CompletedProcess[str]) -> str:
    assert result.returncode == 0, result.stdout + result.stderr
    assert "Traceback" not in result.stderr
    return result.stdout


def _rich_vault(path: Path) -> list[str]:
    """A vault whose memories set every column away from its default: links (one to a memory
    later in export order), embeddings (one with its own stamp), an agent id, a deletion
    waiting to be pushed, and a row already synced."""
    with (
        VaultSession.open(path, PASSPHRASE, create=True) as session,
        session.vault.transaction() as conn,
    ):
        first = store.add_memory(conn, "First [memory] with\ttabs", tags=["a", "b"], project="p1")
        second = store.add_memory(conn, "Zweite Erinnerung ünïcödé", layer="semantic")
        third = store.add_memory(conn, "third one", layer="imagined", scope="rule")
        gone = store.add_memory(conn, "deleted before the export")
        assert store.delete_memory(conn, gone)
        conn.execute(
            "UPDATE engrams SET source = 'ai-session', privacy_level = 'hybrid',"
            ' context = \'{"k":[1,2.5,"x"]}\', strength = 1.5, valence = -0.25,'
            " retrievals = 7, imagined = 1, grounded = 1,"
            " created_at = '2026-01-02T03:04:05.000006+00:00',"
            " last_retrieved = '2026-02-02T00:00:00.000000+00:00', content_type = 'markdown',"
            " occurred_at = '2025-12-31T23:59:59.000000+00:00', agent_id = 'agent-7',"
            " modified_at = '2026-03-03T03:03:03.000003+00:00',"
            " synced_at = '2026-03-03T03:03:03.000003+00:00' WHERE id = ?",
            (first,),
        )
        conn.execute(
            "INSERT INTO engram_links (source_id, target_id, weight, link_type)"
            " VALUES (?, ?, 0.75, 'causal'), (?, ?, 0.5, 'temporal'), (?, ?, 0.25, 'analogical')",
            (first, third, first, second, third, first),
        )
        conn.execute(
            "INSERT INTO engram_embeddings (engram_id, embedding, model, dimensions, created_at)"
            " VALUES (?, ?, 'tiny-model', 3, '2026-04-04T04:04:04.000004+00:00'), (?, ?, ?, 2, ?)",
            (
                first,
                struct.pack("<3d", 0.1, -2.0, 1e-300),
                second,
                struct.pack("<2d", 3.0, 4.0),
                "all-MiniLM-L6-v2",
                store.get_row(conn, second)["modified_at"],  # type: ignore[index]
            ),
        )
    return [first, second, third, gone]


_TABLES = {
    "engrams": "SELECT * FROM engrams ORDER BY id",
    "engram_links": "SELECT * FROM engram_links ORDER BY source_id, target_id",
    "engram_embeddings": "SELECT * FROM engram_embeddings ORDER BY engram_id",
    "tombstones": "SELECT * FROM tombstones ORDER BY id",
    "engrams_fts": "SELECT f.id, f.content, e.id FROM engrams_fts f"
    " JOIN engrams e ON e.rowid = f.rowid ORDER BY f.id",
    "pending_links": "SELECT * FROM sync_pending_links",
}


def _dump(path: Path) -> dict[str, list[dict[str, Any]]]:
    with open_vault(path, PASSPHRASE) as vault:
        tables: dict[str, list[dict[str, Any]]] = {}
        for name, sql in _TABLES.items():
            cursor = vault.conn.execute(sql)
            columns = [d[0] for d in cursor.description]
            tables[name] = [dict(zip(columns, row, strict=True)) for row in cursor.fetchall()]
        return tables


def test_import_of_an_export_reproduces_every_column(tmp_path: Path) -> None:
    source, target = tmp_path / "source", tmp_path / "target"
    first, second, third, gone = _rich_vault(source)
    exported = ok(cli(source, "export", "--include-deleted"))
    lines = [json.loads(line) for line in exported.splitlines()]
    assert [line["id"] for line in lines] == [first, second, third, gone]
    assert lines[-1] == {"deleted": True, "deleted_at": lines[-1]["deleted_at"], "id": gone}
    assert lines[0]["agent_id"] == "agent-7"
    assert lines[0]["embedding_created_at"] == "2026-04-04T04:04:04.000004+00:00"
    assert "embedding_created_at" not in lines[1]  # its stamp is its modified_at
    # every PROTOCOL §4 key is there
    assert set(lines[1]) == {
        "id", "content", "layer", "scope", "content_type", "source", "privacy_level",
        "context", "created_at", "modified_at", "last_retrieved", "occurred_at", "project",
        "tags", "strength", "valence", "retrievals", "imagined", "grounded", "links",
        "embedding", "embedding_model",
    }  # fmt: skip

    ok(cli(target, "init"))
    dump_file = tmp_path / "export.jsonl"
    ok(cli(source, "export", "--include-deleted", "--output", str(dump_file)))
    assert dump_file.stat().st_mode & 0o777 == 0o600  # the memories in clear: owner only
    assert dump_file.read_text(encoding="utf-8") == exported
    summary = ok(cli(target, "import", str(dump_file)))
    assert "added 3, skipped 0 duplicate(s), recorded 1 deletion(s), 0 invalid" in summary

    before, after = _dump(source), _dump(target)
    for row in before["engrams"]:
        row["synced_at"] = None  # an imported memory is a new local row: the next sync pushes it
    for table in before:
        for got, want in zip(after[table], before[table], strict=True):
            assert got == want, table
    assert after == before
    assert len(after["engram_links"]) == 3
    assert len(after["engram_embeddings"]) == 2
    assert after["pending_links"] == []  # the link to a later memory was resolved
    # and the export of the copy is the export of the original
    assert ok(cli(target, "export", "--include-deleted")) == exported

    # importing it again adds nothing: every id is there already
    again = ok(cli(target, "import", str(dump_file), "--json"))
    assert json.loads(again) == {
        "added": 0, "duplicates": 4, "deletions": 0, "dry_run": False, "invalid": [],
    }  # fmt: skip


def test_duplicates_by_content_hash_and_invalid_lines_with_their_numbers(tmp_path: Path) -> None:
    vault = tmp_path / "v"
    ok(cli(vault, "init"))
    kept = ok(cli(vault, "add", "Deploy with make ship")).strip()
    lines = [
        '{"content": "[12] [10:23:45]  deploy   WITH make ship"}',  # same hash (VAULT §4)
        '{"content": "a new memory", "tags": ["t"], "project": "p"}',
        "not json at all",
        "",
        '{"content": "A NEW   memory"}',  # a duplicate of line 2
        '{"content": "x", "layer": "dream"}',
        '{"content": "   "}',
        '{"content": "bad time", "created_at": "yesterday"}',
        '{"content": "long id", "id": "' + "i" * 257 + '"}',
        # the fields of `list --json`
        '{"id": "mem_from-list", "content": "from list", "layer": "semantic", "tags": [],'
        ' "project": null, "created_at": "2026-05-05T05:05:05+00:00",'
        ' "modified_at": "2026-05-06T05:05:05Z", "synced": true}',
    ]
    text = "\n".join(lines) + "\n"
    dry = cli(vault, "import", "-", "--dry-run", stdin=text)
    assert "would add 2, skipped 2 duplicate(s), 5 invalid (dry run" in ok(dry)
    assert [m["id"] for m in json.loads(ok(cli(vault, "list", "--json")))] == [kept]

    result = cli(vault, "import", "-", stdin=text)
    assert "added 2, skipped 2 duplicate(s), 5 invalid" in ok(result)
    problems = [line.strip() for line in result.stderr.splitlines() if "invalid:" in line]
    assert [p.split(":")[1].strip() for p in problems] == [
        "line 3", "line 6", "line 7", "line 8", "line 9",
    ]  # fmt: skip
    assert "content is empty" in problems[2]
    assert "created_at" in problems[3]
    listed = {m["id"]: m for m in json.loads(ok(cli(vault, "list", "--json")))}
    assert len(listed) == 3
    assert kept in listed
    from_list = listed["mem_from-list"]
    assert (from_list["layer"], from_list["created_at"]) == (
        "semantic",
        "2026-05-05T05:05:05+00:00",
    )
    assert from_list["modified_at"] == "2026-05-06T05:05:05.000000+00:00"  # canonical form
    assert from_list["synced"] is False
    new = [m for m in listed.values() if m["content"] == "a new memory"]
    assert len(new) == 1
    assert (new[0]["tags"], new[0]["project"]) == (["t"], "p")

    # --keep-duplicates imports the same content again (new ids), the id check stays
    keep = cli(vault, "import", "-", "--keep-duplicates", stdin='{"content": "a new memory"}\n')
    assert "added 1, skipped 0" in ok(keep)


def test_markdown_notes_per_file_and_per_heading(tmp_path: Path) -> None:
    vault, notes = tmp_path / "v", tmp_path / "notes"
    (notes / "sub").mkdir(parents=True)
    (notes / "a.md").write_text(
        "---\ntitle: ignored\ntags:\n  - ops\n  - 'on call'\nproject: infra\n---\n"
        "# Deploy\nmake ship\n\n```sh\n# a comment, not a heading\n```\n## Rollback\nmake undo\n",
        encoding="utf-8",
    )
    (notes / "sub" / "b.md").write_text("Just a line.\n", encoding="utf-8")
    (notes / "empty.md").write_text("---\ntags: [x]\n---\n\n", encoding="utf-8")
    (notes / "bad.md").write_text("---\nlayer: dream\n---\ntext\n", encoding="utf-8")
    (notes / "skip.txt").write_text("not a note", encoding="utf-8")
    ok(cli(vault, "init"))

    per_file = cli(vault, "import", str(notes), "--dry-run")
    assert "would add 2, skipped 0 duplicate(s), 2 invalid" in ok(per_file)
    assert "empty.md:4: the note is empty" in per_file.stderr
    assert "bad.md:1: front matter layer" in per_file.stderr

    result = cli(vault, "import", str(notes), "--split-headings")
    assert "added 3, skipped 0 duplicate(s), 1 invalid" in ok(result)
    listed = json.loads(ok(cli(vault, "list", "--json")))
    by_content = {m["content"]: m for m in listed}
    deploy = by_content["# Deploy\nmake ship\n\n```sh\n# a comment, not a heading\n```"]
    assert (deploy["tags"], deploy["project"]) == (["ops", "on call"], "infra")
    assert by_content["## Rollback\nmake undo"]["tags"] == ["ops", "on call"]
    assert by_content["Just a line."]["tags"] == []
    # a file's sections keep their order
    contents = [m["content"] for m in listed]
    assert contents.index(deploy["content"]) < contents.index("## Rollback\nmake undo")

    # one file, again: everything is a duplicate now
    again = cli(vault, "import", str(notes / "a.md"), "--split-headings")
    assert "added 0, skipped 2 duplicate(s), 0 invalid" in ok(again)


def test_from_another_vault_with_its_own_passphrase(tmp_path: Path) -> None:
    source, target = tmp_path / "other", tmp_path / "mine"
    other_pass = "the other vault's own passphrase"
    with (
        VaultSession.open(source, other_pass, create=True) as session,
        session.vault.transaction() as conn,
    ):
        a = store.add_memory(conn, "from the other vault", tags=["o"])
        b = store.add_memory(conn, "linked to the first")
        conn.execute(
            "INSERT INTO engram_links (source_id, target_id, weight, link_type)"
            " VALUES (?, ?, 0.9, 'associative')",
            (b, a),
        )
    listing = sorted(p.name for p in source.iterdir())
    ok(cli(target, "init"))
    mine = ok(cli(target, "add", "From the other   VAULT")).strip()  # `a`'s content hash
    wrong = cli(
        target, "import", "--from-vault", str(source), env={"ENGRAM_SOURCE_PASSPHRASE": "nope"}
    )
    assert wrong.returncode == 1
    assert "wrong passphrase for the source vault" in wrong.stderr
    assert "ENGRAM_SOURCE_PASSPHRASE" in wrong.stderr
    result = cli(
        target, "import", "--from-vault", str(source), env={"ENGRAM_SOURCE_PASSPHRASE": other_pass}
    )
    assert "added 1, skipped 1 duplicate(s), 0 invalid" in ok(result)
    shown = json.loads(ok(cli(target, "show", b)))
    # `a` was skipped as a duplicate of `mine`: the link to it points at `mine`
    assert shown["links"] == [{"link_type": "associative", "target_id": mine, "weight": 0.9}]
    assert sorted(p.name for p in source.iterdir()) == listing  # read, nothing added there
    same = cli(target, "import", "--from-vault", str(target))
    assert same.returncode == 1
    assert "this vault itself" in same.stderr
    neither = cli(target, "import")
    assert neither.returncode == 1
    assert "give one source" in neither.stderr


def test_imported_memories_are_pushed_by_the_next_sync(tmp_path: Path, relay: Relay) -> None:
    a, b = tmp_path / "a", tmp_path / "b"
    for vault, label in ((a, "a"), (b, "b")):
        ok(cli(vault, "init"))
        ok(cli(vault, "link", "--relay", relay.url, "--api-key", ADMIN_KEY,
               "--vault-id", "imports", "--label", label))  # fmt: skip
    text = "".join(json.dumps({"content": f"imported memory {n}"}) + "\n" for n in range(25))
    assert "added 25" in ok(cli(a, "import", "-", stdin=text))
    status = json.loads(ok(cli(a, "status", "--json")))
    assert status["pending_pushes"] == 25
    pushed = json.loads(ok(cli(a, "sync", "--json")))
    assert pushed["pushed"] == 25
    pulled = json.loads(ok(cli(b, "sync", "--json")))
    assert pulled["applied"] == 25
    assert ok(cli(b, "export")) == ok(cli(a, "export"))  # the same memories, field for field


def _on_a_terminal(vault: Path, *args: str) -> tuple[subprocess.CompletedProcess[str], bytes]:
    """Run with stderr on a pseudo-terminal (what a person sees); stdout stays a pipe."""
    env = dict(os.environ, ENGRAM_PASSPHRASE=PASSPHRASE, COLUMNS="100")
    return stderr_on_a_terminal([EXE, "--vault", str(vault), *args], env)


def test_a_determinate_progress_bar_on_a_terminal_only(tmp_path: Path) -> None:
    vault = tmp_path / "v"
    ok(cli(vault, "init"))
    source = tmp_path / "many.jsonl"
    source.write_text(
        "".join(json.dumps({"content": f"memory number {n}"}) + "\n" for n in range(3000)),
        encoding="utf-8",
    )
    result, terminal = _on_a_terminal(vault, "import", str(source), "--dry-run")
    assert result.returncode == 0
    assert "would add 3000" in result.stdout
    text = terminal.decode("utf-8", "replace")
    assert "importing" in text
    assert "  0%" in text  # a bar with a total: it starts at 0% ...
    assert "100%" in text  # ... and ends at 100%
    piped = cli(vault, "import", str(source), "--dry-run")
    assert "%" not in piped.stderr  # no bar when stderr is not a terminal
    assert "\x1b" not in piped.stderr
