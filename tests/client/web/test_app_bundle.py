"""`engram-sync web` serves the bundle as the relay's /vault/ does (client/_web/app.py and
shared_format.web_bundle): the same index.html with SRI, the same CSP, the manifest's files
and nothing else."""

from __future__ import annotations

import httpx

from bench.browser import ServedApp
from engram_sync.client._web.app import build_app
from engram_sync.client._web.bundle import bundle_dir
from engram_sync.shared_format.web_bundle import bundle_from_folder


def test_the_local_server_serves_the_bundle_as_the_relay_does() -> None:
    expected = bundle_from_folder(bundle_dir())
    app = build_app(bundle_dir(), "http://127.0.0.1:9", "v")
    with ServedApp(app) as web, httpx.Client(base_url=web.url, timeout=10) as http:
        for path, data in expected.files.items():
            answer = http.get(f"/{path}")
            assert answer.content == data, path
            assert answer.headers["content-security-policy"] == expected.content_security_policy
        root = http.get("/")
        assert root.content == expected.files["index.html"]
        assert b'<script type="importmap">' in root.content
        for probe in ("/.hidden", "/js/", "/js/%2e%2e/%2e%2e/pyproject.toml", "/nope.js"):
            answer = http.get(probe)
            assert answer.status_code == 404, probe
            assert answer.json()["code"] == "not_found"
