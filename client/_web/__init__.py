"""`engram-sync web` (issue 34, docs/web-vault.md): the web vault's static bundle served from
the installed package on 127.0.0.1, and `/v1/*` proxied to the vault's linked relay so the page
is same-origin and the relay never serves code. Starlette and uvicorn (the `web` extra) are
imported by `app` and `serve` only; `bundle`, `headers` and `forwarding` are pure."""
