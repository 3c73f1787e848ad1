"""The child side of `bench.relay_process`: `python -m bench.relay_child` serves the relay
until SIGTERM, like `engram-relay serve --workers N`.

Its own module, importing nothing of the harness at its top (issue 36): each `--workers`
process is spawned by multiprocessing, which imports the parent's main module again in
every worker. When the child was `bench.relay_process`, that import brought the
harness's own dependencies (`bench.database`: alembic, SQLAlchemy; httpx, psutil) into
every relay process, about 24 MiB each that a relay started by `engram-relay serve`
does not carry: 75 MiB of the bench's relay RSS at 2 workers. `bench.relay_rss` reports
the relay processes' RSS at rest so that such a cost shows up.
"""

from __future__ import annotations

import os
from typing import Final

ENV_DATABASE_URL: Final = "ENGRAM_BENCH_DATABASE_URL"
ENV_PORT: Final = "ENGRAM_BENCH_PORT"
ENV_KEY: Final = "ENGRAM_BENCH_KEY"
ENV_WORKERS: Final = "ENGRAM_BENCH_WORKERS"
KEY_RATE: Final = 1_000_000  # requests/second: the bench measures the relay, not its limiter


def serve() -> None:
    """Serve the relay until SIGTERM, with the production defaults but the bench's key."""
    from engram_sync.relay.services.config import config_from_env
    from engram_sync.relay.serving.server import export_for_workers, serve_app

    # The bench's key as a static key (SYNC_API_KEYS), so that every worker knows it.
    os.environ["SYNC_API_KEYS"] = f"{os.environ[ENV_KEY]}:{KEY_RATE}"
    # bench.live_feed holds 10,000 idle event streams: the default cap is 1,000 a process.
    os.environ.setdefault("ENGRAM_RELAY_MAX_CONNECTIONS", "12000")
    # ...all with one key from one address (bench.stream_hog sets the production caps).
    os.environ.setdefault("ENGRAM_RELAY_EVENTS_MAX_PER_KEY", "1000000")
    os.environ.setdefault("ENGRAM_RELAY_EVENTS_MAX_PER_ADDRESS", "1000000")
    url = os.environ[ENV_DATABASE_URL]
    workers = int(os.environ.get(ENV_WORKERS, "1"))
    export_for_workers(url, {}, "warning", "text")
    serve_app(config_from_env(url), host="127.0.0.1", port=int(os.environ[ENV_PORT]),
              workers=workers)  # fmt: skip


if __name__ == "__main__":
    serve()
