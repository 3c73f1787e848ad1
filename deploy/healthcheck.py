"""Container health check: exit 0 when the relay's /ready answers 200, else 1.

The slim Python image has no curl; this uses only the standard library. It asks
the relay on this host, at ENGRAM_RELAY_PORT (default 8788). /ready is 200 only
when the relay's database answers (PROTOCOL §11).
"""

from __future__ import annotations

import os
import sys
import urllib.error
import urllib.request


def ready_url(environ: dict[str, str] | os._Environ[str] = os.environ) -> str:
    """The /ready URL of the relay in this container."""
    host = environ.get("ENGRAM_RELAY_HOST", "").strip()
    if host in ("", "0.0.0.0", "::", "[::]"):  # noqa: S104 - a bind-all address, not a target
        host = "127.0.0.1"
    elif ":" in host and not host.startswith("["):
        host = f"[{host}]"
    port = environ.get("ENGRAM_RELAY_PORT", "").strip() or "8788"
    return f"http://{host}:{port}/ready"


def main() -> int:
    """Probe /ready once; a short reason goes to stderr when not ready."""
    url = ready_url()
    try:
        with urllib.request.urlopen(url, timeout=4) as response:  # noqa: S310 - fixed http URL
            status = int(response.status)
    except urllib.error.HTTPError as exc:
        status = exc.code
    except OSError as exc:
        print(f"not ready: {url}: {exc}", file=sys.stderr)
        return 1
    if status != 200:
        print(f"not ready: {url} answered {status}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
