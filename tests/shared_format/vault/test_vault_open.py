"""Opening and creating vaults with real SQLCipher files (VAULT §1, §2)."""

from __future__ import annotations

import os
import shutil
import sqlite3
import stat
from pathlib import Path

import pytest

from engram_sync.shared_format.errors import VaultError, WrongPassphraseError
from engram_sync.shared_format.vault import (
    IntegrityError,
    Vault,
    VaultKeyKind,
    legacy_passphrase_vault_key,
    open_vault,
)

from .helpers import (
    MACHINE_ID,
    PASSPHRASE,
    cached_passphrase_vault_key,
    key_opens,
    machine_key,
    make_db,
    other_machine,
    plain_sqlite_error,
    raw_connect,
    snapshot,
    this_machine,
)
from .test_vault_keys import FALLBACK_SALT16

OLD_TABLE = "CREATE TABLE notes (body TEXT); INSERT INTO notes VALUES ('kept');"


def current_key(vault_dir: Path, passphrase: str = PASSPHRASE) -> str:
    """The current-derivation key for a vault, from its salt file bytes."""
    return cached_passphrase_vault_key(passphrase, (vault_dir / "salt").read_bytes()[:16])


@pytest.fixture(scope="module")
def template_vault(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A passphrase vault created once per module (closed), with one engram."""
    vault_dir = tmp_path_factory.mktemp("template") / "vault"
    with open_vault(vault_dir, PASSPHRASE, create=True, machine_id=this_machine) as vault:
        vault.conn.execute(
            "INSERT INTO engrams (id, layer, content, context, created_at)"
            " VALUES ('eng_1', 'semantic', 'hello', '{}', '2026-01-01T00:00:00.000000+00:00')"
        )
    return vault_dir


@pytest.fixture
def passphrase_vault(template_vault: Path, tmp_path: Path) -> Path:
    """A private copy of the template vault (same salt, so its Argon2id key is memoised)."""
    return Path(shutil.copytree(template_vault, tmp_path / "vault"))


# -- creation ----------------------------------------------------------------------------


def test_create_passphrase_vault(template_vault: Path) -> None:
    assert sorted(os.listdir(template_vault)) == ["engrams.db", "salt"]
    salt = template_vault / "salt"
    assert len(salt.read_bytes()) == 16
    assert stat.S_IMODE(salt.stat().st_mode) == 0o600
    db = template_vault / "engrams.db"
    assert key_opens(db, current_key(template_vault))
    assert not key_opens(db, legacy_passphrase_vault_key(PASSPHRASE))


def test_vault_file_is_not_plain_sqlite(template_vault: Path) -> None:
    db = template_vault / "engrams.db"
    assert not db.read_bytes().startswith(b"SQLite format 3\x00")
    assert plain_sqlite_error(db) == "file is not a database"


def test_reopen_with_passphrase(template_vault: Path) -> None:
    with open_vault(template_vault, PASSPHRASE, machine_id=this_machine) as vault:
        assert vault.key_kind is VaultKeyKind.PASSPHRASE
        assert not vault.rekeyed_from_legacy
        assert vault.path == template_vault
        assert vault.db_path == template_vault / "engrams.db"
        assert vault.conn.execute("SELECT content FROM engrams").fetchall() == [("hello",)]
        assert vault.conn.execute("PRAGMA foreign_keys").fetchone() == (1,)
        assert vault.conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert vault.conn.execute("PRAGMA busy_timeout").fetchone() == (5000,)
        assert vault.conn.execute("PRAGMA user_version").fetchone() == (10,)


def test_create_machine_key_vault(tmp_path: Path) -> None:
    vault_dir = tmp_path / "v"
    with open_vault(vault_dir, None, create=True, machine_id=this_machine) as vault:
        assert vault.key_kind is VaultKeyKind.MACHINE
    assert os.listdir(vault_dir) == ["engrams.db"]  # no salt for a machine-key vault
    assert key_opens(vault_dir / "engrams.db", machine_key(MACHINE_ID))
    with open_vault(vault_dir, None, machine_id=this_machine) as vault:
        assert vault.key_kind is VaultKeyKind.MACHINE


def test_path_with_uri_special_characters(tmp_path: Path) -> None:
    vault_dir = tmp_path / "my vault #1?mode=ro&x=%20"
    open_vault(vault_dir, None, create=True, machine_id=this_machine).close()
    assert os.listdir(vault_dir) == ["engrams.db"]
    with open_vault(vault_dir, None, machine_id=this_machine) as vault:
        vault.conn.execute("INSERT INTO app_metrics (key, value) VALUES ('writes', 1)")


def test_create_refuses_an_empty_passphrase(tmp_path: Path) -> None:
    with pytest.raises(VaultError, match="empty passphrase"):
        open_vault(tmp_path / "v", "", create=True)
    assert not (tmp_path / "v").exists()


def test_create_on_an_empty_database_file(tmp_path: Path) -> None:
    # What a creation that crashed before its first write leaves behind.
    (tmp_path / "engrams.db").touch()
    with pytest.raises(VaultError, match="empty"):
        open_vault(tmp_path, PASSPHRASE)
    with open_vault(tmp_path, PASSPHRASE, create=True) as vault:
        assert vault.key_kind is VaultKeyKind.PASSPHRASE
    assert (tmp_path / "salt").exists()
    assert key_opens(tmp_path / "engrams.db", current_key(tmp_path))


def test_create_true_on_an_existing_vault_just_opens_it(passphrase_vault: Path) -> None:
    salt = (passphrase_vault / "salt").read_bytes()
    with open_vault(passphrase_vault, PASSPHRASE, create=True) as vault:
        assert vault.conn.execute("SELECT count(*) FROM engrams").fetchone() == (1,)
    assert (passphrase_vault / "salt").read_bytes() == salt


# -- failures leave nothing behind -----------------------------------------------------------


def test_wrong_passphrase(passphrase_vault: Path) -> None:
    before = snapshot(passphrase_vault)
    with pytest.raises(
        WrongPassphraseError, match="wrong passphrase or not an Engram vault"
    ) as err:
        open_vault(passphrase_vault, "not the passphrase", machine_id=this_machine)
    assert "not the passphrase" not in str(err.value)
    assert snapshot(passphrase_vault) == before


def test_passphrase_vault_without_passphrase(passphrase_vault: Path) -> None:
    before = snapshot(passphrase_vault)
    with pytest.raises(WrongPassphraseError, match="needs its passphrase"):
        open_vault(passphrase_vault, None, machine_id=this_machine)
    assert snapshot(passphrase_vault) == before


def test_machine_vault_on_another_machine(tmp_path: Path) -> None:
    open_vault(tmp_path, None, create=True, machine_id=this_machine).close()
    before = snapshot(tmp_path)
    with pytest.raises(WrongPassphraseError):
        open_vault(tmp_path, None, machine_id=other_machine)
    assert snapshot(tmp_path) == before


def test_plain_sqlite_file_is_not_a_vault(tmp_path: Path) -> None:
    conn = sqlite3.connect(tmp_path / "engrams.db")
    conn.execute("CREATE TABLE t (x)")
    conn.commit()
    conn.close()
    before = snapshot(tmp_path)
    with pytest.raises(WrongPassphraseError, match="not an Engram vault"):
        open_vault(tmp_path, PASSPHRASE, machine_id=this_machine)
    assert snapshot(tmp_path) == before


def test_missing_database(tmp_path: Path) -> None:
    with pytest.raises(VaultError, match="no Engram vault") as err:
        open_vault(tmp_path, PASSPHRASE)
    assert not isinstance(err.value, WrongPassphraseError)
    assert os.listdir(tmp_path) == []
    with pytest.raises(VaultError, match="no Engram vault"):
        open_vault(tmp_path / "absent", None, machine_id=this_machine)
    assert not (tmp_path / "absent").exists()


def test_path_that_is_a_file(tmp_path: Path) -> None:
    (tmp_path / "engrams.db").write_bytes(b"x")
    with pytest.raises(VaultError, match="not a directory"):
        open_vault(tmp_path / "engrams.db", PASSPHRASE, create=True)


def test_no_machine_id_without_passphrase(tmp_path: Path) -> None:
    def no_machine_id() -> str:
        raise VaultError("no machine id: test")

    open_vault(tmp_path, None, create=True, machine_id=this_machine).close()
    with pytest.raises(VaultError, match="no machine id"):
        open_vault(tmp_path, None, machine_id=no_machine_id)
    with pytest.raises(VaultError, match="no machine id"):
        open_vault(tmp_path / "new", None, create=True, machine_id=no_machine_id)
    assert not (tmp_path / "new").exists()


# -- the other derivations of VAULT §2 -------------------------------------------------------


def test_legacy_vault_is_rekeyed(tmp_path: Path) -> None:
    legacy = legacy_passphrase_vault_key(PASSPHRASE)
    make_db(tmp_path / "engrams.db", legacy, OLD_TABLE)
    with open_vault(tmp_path, PASSPHRASE, machine_id=this_machine) as vault:
        assert vault.key_kind is VaultKeyKind.PASSPHRASE
        assert vault.rekeyed_from_legacy
        assert vault.conn.execute("SELECT body FROM notes").fetchall() == [("kept",)]
    salt = tmp_path / "salt"
    assert len(salt.read_bytes()) == 16
    assert stat.S_IMODE(salt.stat().st_mode) == 0o600
    assert not key_opens(tmp_path / "engrams.db", legacy)
    with open_vault(tmp_path, PASSPHRASE, machine_id=this_machine) as vault:
        assert not vault.rekeyed_from_legacy  # opened by the current derivation directly
        assert vault.conn.execute("SELECT body FROM notes").fetchall() == [("kept",)]


def test_legacy_vault_keeps_an_existing_salt(tmp_path: Path) -> None:
    salt = bytes(range(100, 120))
    (tmp_path / "salt").write_bytes(salt)
    make_db(tmp_path / "engrams.db", legacy_passphrase_vault_key(PASSPHRASE), OLD_TABLE)
    with open_vault(tmp_path, PASSPHRASE, machine_id=this_machine) as vault:
        assert vault.rekeyed_from_legacy
    assert (tmp_path / "salt").read_bytes() == salt
    assert key_opens(tmp_path / "engrams.db", cached_passphrase_vault_key(PASSPHRASE, salt[:16]))


def test_legacy_vault_with_a_short_salt_uses_the_fixed_salt(tmp_path: Path) -> None:
    (tmp_path / "salt").write_bytes(b"short")
    make_db(tmp_path / "engrams.db", legacy_passphrase_vault_key(PASSPHRASE), OLD_TABLE)
    open_vault(tmp_path, PASSPHRASE, machine_id=this_machine).close()
    assert (tmp_path / "salt").read_bytes() == b"short"  # "if missing" only
    fixed = cached_passphrase_vault_key(PASSPHRASE, FALLBACK_SALT16)
    assert key_opens(tmp_path / "engrams.db", fixed)


@pytest.mark.parametrize("salt_content", [None, b"", b"0123456789abcde"])
def test_fixed_salt_vault(tmp_path: Path, salt_content: bytes | None) -> None:
    if salt_content is not None:
        (tmp_path / "salt").write_bytes(salt_content)
    fixed = cached_passphrase_vault_key(PASSPHRASE, FALLBACK_SALT16)
    make_db(tmp_path / "engrams.db", fixed, OLD_TABLE)
    with open_vault(tmp_path, PASSPHRASE, machine_id=this_machine) as vault:
        assert vault.key_kind is VaultKeyKind.PASSPHRASE
        assert not vault.rekeyed_from_legacy
        assert vault.conn.execute("SELECT body FROM notes").fetchall() == [("kept",)]
    assert sorted(os.listdir(tmp_path)) == sorted(
        ["engrams.db"] + ([] if salt_content is None else ["salt"])
    )
    assert key_opens(tmp_path / "engrams.db", fixed)


def test_machine_vault_opened_with_a_passphrase_is_not_rekeyed(tmp_path: Path) -> None:
    make_db(tmp_path / "engrams.db", machine_key(), OLD_TABLE)
    with open_vault(tmp_path, PASSPHRASE, machine_id=this_machine) as vault:
        assert vault.key_kind is VaultKeyKind.MACHINE
        assert not vault.rekeyed_from_legacy
    assert os.listdir(tmp_path) == ["engrams.db"]
    assert key_opens(tmp_path / "engrams.db", machine_key())


def test_passphrase_open_skips_the_machine_key_without_a_machine_id(
    template_vault: Path,
) -> None:
    def no_machine_id() -> str:
        raise VaultError("no machine id: test")

    with open_vault(template_vault, PASSPHRASE, machine_id=no_machine_id) as vault:
        assert vault.key_kind is VaultKeyKind.PASSPHRASE
    with pytest.raises(WrongPassphraseError):
        open_vault(template_vault, "wrong", machine_id=no_machine_id)


# -- the Vault object -----------------------------------------------------------------------


def test_transaction_commits_and_rolls_back(passphrase_vault: Path) -> None:
    insert = (
        "INSERT INTO engrams (id, layer, content, context, created_at)"
        " VALUES (?, 'semantic', 'x', '{}', '2026-01-01T00:00:00.000000+00:00')"
    )
    with open_vault(passphrase_vault, PASSPHRASE) as vault:
        with vault.transaction() as conn:
            conn.execute(insert, ("eng_2",))

        def insert_then_fail() -> None:
            with vault.transaction() as conn:
                conn.execute(insert, ("eng_3",))
                conn.execute(insert, ("eng_2",))  # duplicate id

        with pytest.raises(IntegrityError):
            insert_then_fail()
        assert not vault.conn.in_transaction
        ids = [row[0] for row in vault.conn.execute("SELECT id FROM engrams ORDER BY id")]
        assert ids == ["eng_1", "eng_2"]


def test_close_is_idempotent_and_repr_has_no_secret(template_vault: Path) -> None:
    vault = open_vault(template_vault, PASSPHRASE)
    assert isinstance(vault, Vault)
    assert PASSPHRASE not in repr(vault)
    assert "open" in repr(vault)
    vault.close()
    vault.close()
    assert vault.closed


def test_wal_files_are_cleaned_up_on_close(passphrase_vault: Path) -> None:
    vault = open_vault(passphrase_vault, PASSPHRASE)
    vault.conn.execute("UPDATE engrams SET strength = 1.5")
    vault.close()
    assert sorted(os.listdir(passphrase_vault)) == ["engrams.db", "salt"]
    conn = raw_connect(passphrase_vault / "engrams.db", current_key(passphrase_vault))
    assert conn.execute("SELECT strength FROM engrams").fetchall() == [(1.5,)]
    conn.close()
