"""`engram-sync web verify URL` (client/_web/verify.py, verify_fetch.py, client/_cli/
web_command.py) against a real relay process (bench.relay_process: uvicorn + PostgreSQL)
serving a copy of the installed bundle (ENGRAM_RELAY_WEB_VAULT_DIR), with a tampering proxy
in front of it: the honest relay matches in one line (exit 0); each tampering, of the folder
the relay serves or of its answers on the way, is named in the output (exit 1); an
unreachable or garbled relay is one line, exit 2. No hash of a web file is written here:
they are computed."""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import sys
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from typer.testing import CliRunner

from bench.relay_process import RelayProcess
from engram_sync.client._cli.main import app
from engram_sync.shared_format.web_bundle import installed_bundle_dir, read_bundle, sha256_hex
from tests.client.web.tampering_proxy import TamperingProxy
from tests.conftest import migrated_backend_database

EXE = str(Path(sys.executable).parent / "engram-sync")
INSTALLED = sorted(read_bundle(installed_bundle_dir()))


@dataclass
class Served:
    folder: Path
    relay_url: str
    proxy: TamperingProxy


@pytest.fixture(scope="module")
def served(
    request: pytest.FixtureRequest, postgres_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Served]:
    """One relay serving a folder the tests change, behind one tampering proxy."""
    folder = tmp_path_factory.mktemp("relay-web") / "web"
    shutil.copytree(installed_bundle_dir(), folder)
    log = folder.parent / "relay.log"
    with migrated_backend_database(request, postgres_url) as url:
        os.environ["ENGRAM_RELAY_WEB_VAULT_DIR"] = str(folder)  # read by the relay process
        try:
            relay = RelayProcess(url, "verify-" + secrets.token_urlsafe(16), log).start()
        finally:
            del os.environ["ENGRAM_RELAY_WEB_VAULT_DIR"]
        try:
            with TamperingProxy(relay.url) as proxy:
                yield Served(folder, relay.url, proxy)
        finally:
            relay.stop()


@pytest.fixture
def honest(served: Served) -> Served:
    """The relay's folder a copy of the install again, the proxy passing everything."""
    shutil.rmtree(served.folder)
    shutil.copytree(installed_bundle_dir(), served.folder)
    served.proxy.rules.clear()
    return served


def verify(url: str) -> tuple[int, list[str]]:
    result = CliRunner().invoke(app, ["web", "verify", url], env={"COLUMNS": "300"})
    return result.exit_code, result.output.strip().splitlines()


def replace_file(path: Path, data: bytes) -> None:
    """As a deploy would: a new file renamed over the old one."""
    fresh = path.with_name(path.name + ".new")
    fresh.write_bytes(data)
    fresh.replace(path)


def flip_one_byte(data: bytes) -> bytes:
    middle = len(data) // 2
    return data[:middle] + bytes([data[middle] ^ 0x01]) + data[middle + 1 :]


def test_the_honest_relay_matches_in_one_line(honest: Served) -> None:
    for url in (honest.relay_url, honest.relay_url + "/vault/", honest.proxy.url + "/vault"):
        code, lines = verify(url)
        assert (code, len(lines)) == (0, 1), lines
        assert "matches this install" in lines[0]
    done = subprocess.run(  # the installed command itself
        [EXE, "web", "verify", honest.relay_url], capture_output=True, text=True, timeout=60,
        env=dict(os.environ, COLUMNS="300"), check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert len(done.stdout.strip().splitlines()) == 1


@pytest.mark.parametrize("path", INSTALLED)
def test_one_byte_changed_in_any_file_is_named(honest: Served, path: str) -> None:
    target = honest.folder / path
    replace_file(target, flip_one_byte(target.read_bytes()))
    code, lines = verify(honest.relay_url)
    assert code == 1
    assert "differs from this install" in lines[0]
    assert any(re.match(rf"\s+changed\s+{re.escape(path)}: served sha256", x) for x in lines), lines


def _drop_entry(name: str) -> Callable[[bytes, dict[str, str]], tuple[bytes, dict[str, str]]]:
    def rule(body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
        doc = json.loads(body)
        doc["files"] = [f for f in doc["files"] if f["path"] != name]
        return json.dumps(doc).encode(), headers

    return rule


def _lie_about(
    name: str, digest: str
) -> Callable[[bytes, dict[str, str]], tuple[bytes, dict[str, str]]]:
    def rule(body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
        doc = json.loads(body)
        for entry in doc["files"]:
            if entry["path"] == name:
                entry["sha256"] = digest
        return json.dumps(doc).encode(), headers

    return rule


def _add_entry(body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    doc = json.loads(body)
    doc["files"].append({"path": "js/ghost.js", "sha256": "0" * 64, "size": 1, "integrity": "x"})
    return json.dumps(doc).encode(), headers


def _wrong_integrity(body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    text = body.decode()
    at = text.index('"./js/app.js":"sha256-') + len('"./js/app.js":"sha256-')
    return (text[:at] + ("A" if text[at] != "A" else "B") + text[at + 1 :]).encode(), headers


def _inline_script(body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    return body.replace(b"</head>", b"<script>fetch('//evil.example')</script></head>"), headers


def _weak_policy(body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    return body, {**headers, "content-security-policy": "script-src * 'unsafe-inline'"}


def _no_policy(body: bytes, headers: dict[str, str]) -> tuple[bytes, dict[str, str]]:
    return body, {k: v for k, v in headers.items() if k != "content-security-policy"}


def _folder_added(s: Served) -> None:
    (s.folder / "js" / "evil.js").write_bytes(b"fetch('//evil.example')")


def _folder_removed(s: Served) -> None:
    (s.folder / "js" / "search.js").unlink()


def _manifest_lies(s: Served) -> None:
    """The relay serves a changed app.js and its manifest claims the install's hash."""
    original = (s.folder / "js" / "app.js").read_bytes()
    replace_file(s.folder / "js" / "app.js", original + b"\n// changed\n")
    s.proxy.rules["manifest.json"] = _lie_about("js/app.js", sha256_hex(original))


def _proxy(path: str, rule: Callable[..., object]) -> Callable[[Served], None]:
    def tamper(s: Served) -> None:
        s.proxy.rules[path] = rule  # type: ignore[assignment]

    return tamper


#: name -> (the tampering, the (kind, path) pairs the output must name)
TAMPERINGS: dict[str, tuple[Callable[[Served], None], set[tuple[str, str]]]] = {
    "an added file": (_folder_added, {("added", "js/evil.js"), ("changed", "index.html")}),
    "a removed file": (_folder_removed, {("missing", "js/search.js")}),
    "a manifest lying about a file's hash": (
        _manifest_lies, {("changed", "js/app.js"), ("manifest", "js/app.js")}),
    "a manifest leaving a file out": (
        _proxy("manifest.json", _drop_entry("js/vault.js")), {("manifest", "js/vault.js")}),
    "a manifest naming a file the install lacks": (
        _proxy("manifest.json", _add_entry), {("added", "js/ghost.js")}),
    "an index with a wrong integrity": (
        _proxy("index.html", _wrong_integrity), {("changed", "index.html")}),
    "the page at /vault/ alone changed": (
        _proxy("", _inline_script), {("page", "/vault/")}),
    "a weaker policy on the page": (_proxy("", _weak_policy), {("policy", "/vault/")}),
    "no policy on index.html": (_proxy("index.html", _no_policy), {("policy", "index.html")}),
    "a listed file not served": (
        _proxy("js/relay.js", lambda body, headers: None), {("missing", "js/relay.js")}),
}  # fmt: skip


@pytest.mark.parametrize("name", sorted(TAMPERINGS))
def test_each_tampering_is_named(honest: Served, name: str) -> None:
    tamper, expected = TAMPERINGS[name]
    tamper(honest)
    code, lines = verify(honest.proxy.url)
    assert code == 1, lines
    named = {(m.group(1), m.group(2)) for x in lines if (m := re.match(r"\s+(\w+)\s+(\S+):", x))}
    assert expected <= named, (name, lines)
    assert lines[0].endswith(f"{len(lines) - 1} finding{'s' if len(lines) > 2 else ''}")


@pytest.mark.parametrize(
    ("rule", "said"),
    [
        (lambda body, headers: (b"not json", headers), "garbled: the manifest is not JSON"),
        (lambda body, headers: None, "serves no web vault manifest (HTTP 404)"),
        (lambda body, headers: (b"[" * 2_000_000, headers), "larger than allowed"),
    ],
)
def test_a_garbled_relay_is_one_line_and_exit_2(honest: Served, rule: object, said: str) -> None:
    honest.proxy.rules["manifest.json"] = rule  # type: ignore[assignment]
    code, lines = verify(honest.proxy.url)
    assert code == 2
    assert len(lines) == 1
    assert said in lines[0]


def test_an_unreachable_relay_is_one_line_and_exit_2() -> None:
    code, lines = verify("http://127.0.0.1:9/")
    assert (code, len(lines)) == (2, 1)
    assert "did not answer" in lines[0]
    code, lines = verify("ftp://relay.example/")
    assert (code, len(lines)) == (2, 1)
    assert "is not an http(s) URL" in lines[0]


def test_the_url_may_be_the_relay_or_its_vault() -> None:
    from engram_sync.client._web.verify import vault_url

    for url in ("https://r.example", "https://r.example/", "https://r.example/vault",
                "https://r.example/vault/?x=1#y"):  # fmt: skip
        assert vault_url(url) == "https://r.example/vault/"
    assert vault_url("http://h:8/engram/") == "http://h:8/engram/vault/"
