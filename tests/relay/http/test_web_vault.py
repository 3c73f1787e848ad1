"""The web vault served by a real relay at /vault/ (issue 34, relay/http/routes/web_vault.py):
the manifest's files with the strict CSP and SRI, nothing else, JSON 404s, and
ENGRAM_RELAY_WEB_VAULT=0 turning it off."""

from __future__ import annotations

from dataclasses import replace

import httpx
import pytest

from engram_sync.relay.services.config import RelayConfig, config_from_env
from engram_sync.shared_format.web_bundle import (
    bundle_from_folder,
    installed_bundle_dir,
    parse_manifest,
    sha256_hex,
)
from tests.relay.conftest import Relay

PROBES = (
    "/vault/../pyproject.toml",
    "/vault/%2e%2e/pyproject.toml",
    "/vault/js/%2e%2e/%2e%2e/pyproject.toml",
    "/vault/js/",
    "/vault/js",
    "/vault//etc/passwd",
    "/vault/%00",
    "/vault/.hidden",
    "/vault/nope.js",
    "/vault/index.html/x",
    "/vault/" + "a" * 5000,
    "/vault/%ff",
    "/vault/%c0%ae%c0%ae/pyproject.toml",
    "/vault/js/app.js%00",
    "/vault/js\\app.js",
    "/vault/INDEX.HTML",
)


@pytest.fixture
def relay_config(relay_config: RelayConfig, request: pytest.FixtureRequest) -> RelayConfig:
    return replace(relay_config, web_vault=getattr(request, "param", True))


def test_the_relay_serves_the_installed_bundle_with_its_policy(relay: Relay) -> None:
    expected = bundle_from_folder(installed_bundle_dir())
    with httpx.Client(base_url=relay.url, timeout=10) as http:
        listed = parse_manifest(http.get("/vault/manifest.json").content)
        assert listed == {path: sha256_hex(data) for path, data in expected.files.items()}
        for path, data in expected.files.items():
            answer = http.get(f"/vault/{path}")
            assert answer.status_code == 200, path
            assert answer.content == data, path
            assert answer.headers["content-security-policy"] == expected.content_security_policy
            assert answer.headers["x-content-type-options"] == "nosniff"
            assert answer.headers["referrer-policy"] == "no-referrer"
        root = http.get("/vault/")
        assert root.content == expected.files["index.html"]
        assert root.headers["content-type"].startswith("text/html")
        assert b'integrity="sha256-' in root.content
        assert http.get("/vault/js/app.js").headers["content-type"].startswith("text/javascript")
        moved = http.get("/vault")
        assert (moved.status_code, moved.headers["location"]) == (308, "vault/")


def test_nothing_outside_the_manifest_is_served(relay: Relay) -> None:
    with httpx.Client(base_url=relay.url, timeout=10) as http:
        for probe in PROBES:
            answer = http.get(httpx.URL(relay.url + probe))
            assert 400 <= answer.status_code < 500, (probe, answer.status_code)
            assert "code" in answer.json(), probe
            assert "[project]" not in answer.text
        for method in ("POST", "PUT", "DELETE"):
            answer = http.request(method, "/vault/index.html")
            assert 400 <= answer.status_code < 500, method


@pytest.mark.parametrize("relay_config", [False], indirect=True)
def test_off_serves_nothing(relay: Relay) -> None:
    with httpx.Client(base_url=relay.url, timeout=10) as http:
        for path in ("/vault/", "/vault/index.html", "/vault/manifest.json", "/vault"):
            answer = http.get(path)
            assert answer.status_code == 404, path
            assert answer.json()["code"] == "not_found"
        assert http.get("/v1/info").status_code == 200


def test_the_settings_are_read_from_the_environment() -> None:
    url = "postgresql://x@localhost/x"
    assert config_from_env(url, {}).web_vault is True
    assert config_from_env(url, {"ENGRAM_RELAY_WEB_VAULT": "0"}).web_vault is False
    assert config_from_env(url, {"ENGRAM_RELAY_WEB_VAULT": "Off"}).web_vault is False
    assert config_from_env(url, {"ENGRAM_RELAY_WEB_VAULT": "1"}).web_vault is True
    with pytest.raises(ValueError, match="ENGRAM_RELAY_WEB_VAULT"):
        config_from_env(url, {"ENGRAM_RELAY_WEB_VAULT": "maybe"})
    folder = config_from_env(url, {"ENGRAM_RELAY_WEB_VAULT_DIR": " /srv/web "})
    assert folder.web_vault_dir == "/srv/web"
