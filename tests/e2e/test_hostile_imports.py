"""Import files are hostile input, and an export may land in a shared folder (issue 31):
through the real `engram-sync` executable on real SQLCipher vaults, each attack next to
its honest case.

- ids the relay refuses (control characters) are invalid lines, from JSONL and from
  another vault, never memories that block every push (finding 6);
- a Markdown folder's symbolic links, to files or folders, are not followed, and are
  named in the summary (finding 5);
- `export -o FILE` never writes through a file or link someone else put at a fixed temp
  name, and lands 0600 (finding 10);
- a JSONL line past the cap is an invalid line, read in bounded pieces (finding 11).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
from pathlib import Path

from engram_sync.shared_format.vault import open_vault
from tests.e2e.test_import_export_cli import EXE, PASSPHRASE, cli, ok


def _contents(vault: Path) -> dict[str, str]:
    with open_vault(vault, PASSPHRASE) as opened:
        return dict(opened.conn.execute("SELECT id, content FROM engrams"))


# --- finding 6: ids the relay refuses are invalid lines ---------------------------------------


def test_jsonl_ids_with_control_characters_are_invalid_lines(tmp_path: Path) -> None:
    vault = tmp_path / "v"
    ok(cli(vault, "init"))
    lines = [
        {"id": "mem_good", "content": "an honest memory"},
        {"id": "mem_bad\x07bell", "content": "a bell in the id"},
        {"id": "mem_bad\nnewline", "content": "a newline in the id"},
        {"deleted": True, "id": "mem_gone\x00"},
        {"deleted": True, "id": "mem_gone_honestly"},
    ]
    text = "".join(json.dumps(line) + "\n" for line in lines)
    result = cli(vault, "import", "-", "--json", stdin=text)
    summary = json.loads(ok(result))
    assert (summary["added"], summary["deletions"]) == (1, 1)
    assert [i["where"] for i in summary["invalid"]] == ["line 2", "line 3", "line 4"]
    assert all("control characters" in i["reason"] for i in summary["invalid"])
    assert _contents(vault) == {"mem_good": "an honest memory"}


def test_from_vault_rows_with_bad_ids_are_reported_not_imported(tmp_path: Path) -> None:
    source, target = tmp_path / "source", tmp_path / "target"
    ok(cli(source, "init"))
    ok(cli(target, "init"))
    ok(cli(source, "add", "an honest memory"))
    with open_vault(source, PASSPHRASE) as opened:  # as another tool would write it
        opened.conn.execute(
            "INSERT INTO engrams (id, layer, content, context, created_at, tags, modified_at)"
            " VALUES ('mem_bad\x1b[31m', 'episodic', 'an escape in the id', '{}',"
            " '2026-05-05T05:05:05.000000+00:00', '[]', '2026-05-05T05:05:05.000000+00:00')"
        )
    result = cli(target, "import", "--from-vault", str(source), "--json",
                 env={"ENGRAM_SOURCE_PASSPHRASE": PASSPHRASE})  # fmt: skip
    summary = json.loads(ok(result))
    assert summary["added"] == 1
    assert len(summary["invalid"]) == 1
    assert "control characters" in summary["invalid"][0]["reason"]
    assert list(_contents(target).values()) == ["an honest memory"]


# --- finding 5: a notes folder's links are not followed ---------------------------------------

SECRET = "-----BEGIN OPENSSH PRIVATE KEY----- not for the team"


def _notes_folder(tmp_path: Path) -> Path:
    """notes/ with two honest notes, a link to a private key, a link to a folder outside, a
    link to a note inside, and a FIFO named like a note."""
    ssh = tmp_path / "home" / ".ssh"
    ssh.mkdir(parents=True)
    (ssh / "id_ed25519").write_text(SECRET + "\n", encoding="utf-8")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "other.md").write_text("a note outside the folder\n", encoding="utf-8")
    notes = tmp_path / "notes"
    (notes / "sub").mkdir(parents=True)
    (notes / "honest.md").write_text("an honest note\n", encoding="utf-8")
    (notes / "sub" / "inner.md").write_text("an inner note\n", encoding="utf-8")
    (notes / "leak.md").symlink_to(ssh / "id_ed25519")
    (notes / "elsewhere").symlink_to(outside, target_is_directory=True)
    (notes / "sub" / "again.md").symlink_to(notes / "honest.md")
    os.mkfifo(notes / "pipe.md")
    return notes


def test_a_notes_folder_follows_no_symbolic_link(tmp_path: Path) -> None:
    vault = tmp_path / "v"
    ok(cli(vault, "init"))
    notes = _notes_folder(tmp_path)
    result = cli(vault, "import", str(notes))
    out = ok(result)
    assert "added 2" in out
    assert "4 invalid" in out
    shown = result.stderr
    for name in ("leak.md", "elsewhere", "sub/again.md"):
        assert f"invalid: {name}: a symbolic link: not followed" in shown, shown
    assert "invalid: pipe.md: not a regular file" in shown
    contents = _contents(vault).values()
    assert sorted(contents) == ["an honest note", "an inner note"]  # the honest case
    assert not any("PRIVATE KEY" in text or "outside" in text for text in contents)

    as_json = json.loads(ok(cli(vault, "import", str(notes), "--json", "--dry-run")))
    assert {i["where"] for i in as_json["invalid"]} == {
        "elsewhere", "leak.md", "pipe.md", "sub/again.md"
    }  # fmt: skip


def test_a_folder_of_nothing_but_links_says_so(tmp_path: Path) -> None:
    vault = tmp_path / "v"
    ok(cli(vault, "init"))
    notes = tmp_path / "notes"
    notes.mkdir()
    (tmp_path / "key").write_text(SECRET, encoding="utf-8")
    (notes / "leak.md").symlink_to(tmp_path / "key")
    refused = cli(vault, "import", str(notes))
    assert refused.returncode == 1
    assert "1 skipped: links are not followed" in refused.stderr
    assert "Traceback" not in refused.stderr
    assert _contents(vault) == {}


def test_a_folder_swapped_for_a_link_after_the_listing_is_not_read(tmp_path: Path) -> None:
    # an internal test: the race between listing and reading cannot be driven through the CLI
    from engram_sync.client._vault.notes import LINK_SKIPPED, markdown_files, note_items
    from engram_sync.client._vault.transfer import ImportMemory, Invalid

    notes = _notes_folder(tmp_path)
    listed = markdown_files(notes)
    assert Path("sub/inner.md") in listed.files
    (notes / "sub" / "inner.md").unlink()
    (notes / "sub" / "again.md").unlink()
    (notes / "sub").rmdir()
    (notes / "sub").symlink_to(tmp_path / "home" / ".ssh", target_is_directory=True)
    (tmp_path / "home" / ".ssh" / "inner.md").write_text(SECRET, encoding="utf-8")
    items = list(note_items(listed.root, Path("sub/inner.md"), split_headings=False, label="x"))
    assert items == [Invalid("x", LINK_SKIPPED)]
    honest = list(note_items(listed.root, Path("honest.md"), split_headings=False, label="h"))
    assert isinstance(honest[0], ImportMemory)
    assert honest[0].memory.content == "an honest note"


# --- finding 10: export -o FILE in a shared folder --------------------------------------------


def _shared_export_folder(tmp_path: Path) -> tuple[Path, Path]:
    vault = tmp_path / "v"
    ok(cli(vault, "init"))
    ok(cli(vault, "add", "a memory in clear text"))
    shared = tmp_path / "shared"
    shared.mkdir()
    shared.chmod(0o1777)  # a sticky, world-writable folder, as /tmp
    return vault, shared


def _landed(path: Path) -> None:
    """The honest result: the export itself, a regular file, 0600."""
    assert not path.is_symlink()
    assert path.stat().st_mode & 0o777 == 0o600
    assert json.loads(path.read_text(encoding="utf-8"))["content"] == "a memory in clear text"


def test_export_never_writes_into_a_temp_file_someone_else_made(tmp_path: Path) -> None:
    vault, shared = _shared_export_folder(tmp_path)
    planted = shared / ".out.jsonl.tmp"  # another user's file at the old fixed temp name,
    planted.write_text("planted\n", encoding="utf-8")
    planted.chmod(0o666)
    with planted.open(encoding="utf-8") as watcher:  # ... which they keep open to read
        assert "exported 1 line(s)" in ok_err(cli(vault, "export", "-o", str(shared / "out.jsonl")))
        assert watcher.read() == "planted\n"  # not truncated, nothing written into it
    _landed(shared / "out.jsonl")
    assert {p.name for p in shared.iterdir()} == {"out.jsonl", ".out.jsonl.tmp"}


def test_export_never_writes_through_a_link_at_its_temp_name(tmp_path: Path) -> None:
    vault, shared = _shared_export_folder(tmp_path)
    loot = shared / "loot"  # a file the other user can read
    loot.write_text("loot\n", encoding="utf-8")
    (shared / ".out.jsonl.tmp").symlink_to(loot)
    ok(cli(vault, "export", "-o", str(shared / "out.jsonl")))
    assert loot.read_text(encoding="utf-8") == "loot\n"  # not written through the link
    _landed(shared / "out.jsonl")


def ok_err(result: subprocess.CompletedProcess[str]) -> str:
    ok(result)
    return result.stderr


# --- finding 11: a JSONL line is never read whole ---------------------------------------------


def test_a_line_past_the_cap_is_an_invalid_line_and_the_rest_imports(tmp_path: Path) -> None:
    vault = tmp_path / "v"
    ok(cli(vault, "init"))
    cap = 1000

    def line(text: str, size: int) -> bytes:
        """A valid JSONL memory of exactly `size` bytes, the newline not counted."""
        head = json.dumps({"content": text + " "}).encode()[:-2]
        return head + b"x" * (size - len(head) - 2) + b'"}'

    at_cap, past_cap = line("exactly at the cap", cap), line("one byte too long", cap + 1)
    assert (len(at_cap), len(past_cap)) == (cap, cap + 1)
    source = tmp_path / "lines.jsonl"
    source.write_bytes(
        b'{"content": "first"}\n' + past_cap + b"\n" + at_cap + b"\n" + b'{"content": "fourth"}\n'
        + line("last, too long, without a newline", 5 * cap)
    )  # fmt: skip
    for args in ([str(source)], ["-"]):
        stdin = source.read_text(encoding="utf-8") if args == ["-"] else None
        result = cli(vault, "import", *args, "--max-line-bytes", str(cap), "--json",
                     "--dry-run", stdin=stdin)  # fmt: skip
        summary = json.loads(ok(result))
        assert summary["added"] == 3  # first, the line at the cap, fourth: the honest case
        assert [(i["where"], i["reason"]) for i in summary["invalid"]] == [
            ("line 2", f"{cap + 1} bytes, longer than the {cap} a line may have: skipped"),
            ("line 5", f"{5 * cap} bytes, longer than the {cap} a line may have: skipped"),
        ]


def _peak_rss_kib(vault: Path, *args: str, stdin: Path) -> tuple[int, str]:
    """Run the CLI and return its own peak resident size (KiB) and its stdout."""
    env = dict(os.environ, ENGRAM_PASSPHRASE=PASSPHRASE)
    env.pop("ENGRAM_VAULT", None)
    with stdin.open("rb") as feed:
        child = subprocess.Popen(
            [EXE, "--vault", str(vault), *args], stdin=feed, stdout=subprocess.PIPE,
            stderr=subprocess.DEVNULL, env=env,
        )  # fmt: skip
        assert child.stdout is not None
        out = child.stdout.read().decode()
        _, status, usage = os.wait4(child.pid, 0)
        child.returncode = os.waitstatus_to_exitcode(status)
    assert child.returncode == 0, out
    return usage.ru_maxrss, out


def test_a_huge_line_is_read_in_bounded_pieces_with_the_default_cap(tmp_path: Path) -> None:
    vault = tmp_path / "v"
    ok(cli(vault, "init"))
    small = tmp_path / "small.jsonl"
    small.write_text('{"content": "a small memory"}\n', encoding="utf-8")
    huge = tmp_path / "huge.jsonl"
    with huge.open("wb") as handle:  # 64 MiB of one JSON line, then an honest one
        handle.write(b'{"content": "')
        for _ in range(64):
            handle.write(b"x" * (1024 * 1024))
        handle.write(b'"}\n{"content": "after the huge line"}\n')
    baseline, _ = _peak_rss_kib(vault, "import", "-", "--dry-run", "--json", stdin=small)
    peak, out = _peak_rss_kib(vault, "import", "-", "--dry-run", "--json", stdin=huge)
    summary = json.loads(out)
    assert summary["added"] == 1
    assert [i["where"] for i in summary["invalid"]] == ["line 1"]
    # the cap (16 MiB) and a chunk, not the line (64 MiB): well under 48 MiB above a small run
    assert peak - baseline < 48 * 1024, (baseline, peak)


DEPTH = 1200  # past Python's default recursion limit


def _deep_folder(notes: Path) -> None:
    """notes/d/d/.../d/deep.md, DEPTH levels, made with paths relative to a descriptor."""
    fd = os.open(notes, os.O_RDONLY)
    try:
        for _ in range(DEPTH):
            os.mkdir("d", dir_fd=fd)
            inner = os.open("d", os.O_RDONLY, dir_fd=fd)
            os.close(fd)
            fd = inner
        with os.fdopen(os.open("deep.md", os.O_WRONLY | os.O_CREAT, 0o600, dir_fd=fd), "w") as f:
            f.write("the deepest note\n")
    finally:
        os.close(fd)


def _remove_deep_folder(notes: Path) -> None:
    """Undo `_deep_folder` without recursion (shutil.rmtree, and so pytest's clean-up of old
    temporary folders, recurses once per level and would fail on it)."""
    fds = [os.open(notes, os.O_RDONLY)]
    try:
        while True:
            try:
                fds.append(os.open("d", os.O_RDONLY | os.O_NOFOLLOW, dir_fd=fds[-1]))
            except FileNotFoundError:
                break
        with contextlib.suppress(FileNotFoundError):
            os.unlink("deep.md", dir_fd=fds[-1])
        while len(fds) > 1:
            os.close(fds.pop())
            os.rmdir("d", dir_fd=fds[-1])
    finally:
        for fd in fds:
            os.close(fd)


def test_a_folder_nested_1200_deep_imports_without_recursion(tmp_path: Path) -> None:
    vault = tmp_path / "v"
    ok(cli(vault, "init"))
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "top.md").write_text("the top note\n", encoding="utf-8")
    _deep_folder(notes)
    try:
        summary = json.loads(ok(cli(vault, "import", str(notes), "--json")))
    finally:
        _remove_deep_folder(notes)
    assert summary["added"] == 2, summary
    assert not (notes / "d").exists()
