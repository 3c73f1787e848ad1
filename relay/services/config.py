"""Relay configuration: one frozen object built from CLI options and the environment."""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Final

from engram_sync.relay.db.url import to_libpq_url
from engram_sync.relay.domain.api_keys import StaticKey, parse_static_keys
from engram_sync.relay.domain.client_address import (
    ENV_TRUSTED_PROXIES,
    Network,
    parse_trusted_proxies,
)
from engram_sync.relay.domain.scan_admission import (
    DEFAULT_PER_CLIENT,
    DEFAULT_VAULT_RUNNING,
    DEFAULT_VAULT_WAITING,
    ENV_PER_CLIENT,
    ENV_VAULT_RUNNING,
    ENV_VAULT_WAITING,
    ScanLimits,
)
from engram_sync.relay.domain.stream_holders import (
    DEFAULT_PER_ACCOUNT,
    DEFAULT_PER_ADDRESS,
    DEFAULT_PER_KEY,
    ENV_PER_ACCOUNT,
    ENV_PER_ADDRESS,
    ENV_PER_KEY,
    StreamCaps,
)

DEFAULT_PORT: Final = 8788
DEFAULT_MAX_BLOB_BYTES: Final = 1_048_576  # PROTOCOL §6 step 2: base64 characters of ciphertext
DEFAULT_MAX_BODY_BYTES: Final = 64 * 1024 * 1024
DEFAULT_RETENTION_DAYS: Final = 30  # PROTOCOL §12
DEFAULT_RETIRE_GRACE_DAYS: Final = 30  # PROTOCOL §19: pulls of a retired vault, then erasure
DEFAULT_RATE: Final = 100  # PROTOCOL §5: requests/second per key
DEFAULT_PUSH_LANES: Final = (
    1  # concurrent push transactions per process (relay.services.push_groups)
)
# PROTOCOL §7, §9, §11 (issue 14 item 5): a cursor pull page holds at most this many base64
# characters of ciphertext (at least one blob; relay.store.sync), so one pull of a vault of
# large blobs cannot make the relay hold 1000 of them. Well below the client's 32 MiB
# page budget (client._http.relay_client.PULL_PAGE_BUDGET_BYTES) even with one maximal blob over.
DEFAULT_MAX_PAGE_BYTES: Final = 8 * 1024 * 1024
# Seconds between two background maintenance rounds (relay.services.maintenance); 0 turns it off.
DEFAULT_MAINTENANCE_INTERVAL_S: Final = 300
# The scrub (relay.store.scrub, issue 35): seconds between two scrubs of one vault (0 turns
# it off) and vaults scrubbed at most per maintenance round.
DEFAULT_SCRUB_INTERVAL_S: Final = 3600
DEFAULT_SCRUB_PER_ROUND: Final = 20
MIN_METRICS_TOKEN_CHARS: Final = 16
DEFAULT_HEALTH_REFRESH_S: Final = 10.0
# PROTOCOL §15: seconds between two `: ping` comments of an event stream, and how many
# event streams and waiting long-polls one process holds (more get 503 `busy`).
DEFAULT_EVENTS_PING_S: Final = 15.0
DEFAULT_EVENTS_MAX_STREAMS: Final = 10_000
# PROTOCOL §18 (relay.services.scan_gate): the statements that pass over a whole vault (one
# bucket's digest, list, narrowing) that run at once per process, that wait, and each
# one's statement timeout in seconds.
DEFAULT_SCAN_MAX_RUNNING: Final = 2
DEFAULT_SCAN_MAX_WAITING: Final = 8
DEFAULT_SCAN_TIMEOUT_S: Final = 20.0
# PROTOCOL §15: the live change feed. "on": event stream, long-poll and NOTIFY/LISTEN;
# "long-poll": no event stream (for a proxy that buffers streams); "off": none of it
# (no NOTIFY after commits, no LISTEN connection, pull ignores `wait`, /v1/info lists
# neither feature). bench.live_throughput compares push throughput with it on and off.
LIVE_FEED_MODES: Final = ("on", "long-poll", "off")


@dataclass(frozen=True)
class RelayConfig:
    """Everything the relay process needs; secrets only as hashes (static keys)."""

    database_url: str = field(repr=False)  # it may carry the database password
    quota_devices: int = 0  # 0 = unlimited
    quota_bytes: int = 0  # 0 = unlimited
    max_blob_bytes: int = DEFAULT_MAX_BLOB_BYTES
    max_body_bytes: int = DEFAULT_MAX_BODY_BYTES
    max_page_bytes: int = DEFAULT_MAX_PAGE_BYTES
    tombstone_retention_days: int = DEFAULT_RETENTION_DAYS
    retire_grace_days: int = DEFAULT_RETIRE_GRACE_DAYS  # ENGRAM_RETIRE_GRACE_DAYS (§19)
    pool_min_size: int = 2
    pool_max_size: int = 10
    push_lanes: int = DEFAULT_PUSH_LANES
    # ENGRAM_RELAY_HEALTH_REFRESH_S: /health counters, generation (§17) and the heartbeat
    # that shares each key's rate among the live processes (relay.store.replicas).
    health_refresh_secs: float = DEFAULT_HEALTH_REFRESH_S
    maintenance_interval_secs: float = DEFAULT_MAINTENANCE_INTERVAL_S  # 0 = off
    scrub_interval_secs: float = DEFAULT_SCRUB_INTERVAL_S  # ENGRAM_RELAY_SCRUB_INTERVAL_S, 0 = off
    scrub_per_round: int = DEFAULT_SCRUB_PER_ROUND  # ENGRAM_RELAY_SCRUB_PER_ROUND
    # The bearer token /metrics asks for; None serves no metrics (relay.http.routes.system).
    metrics_token: str | None = field(default=None, repr=False)
    static_keys: tuple[StaticKey, ...] = field(default=(), repr=False)
    # Proxy hops whose X-Forwarded-For is believed (relay.domain.client_address); none by default.
    trusted_proxies: tuple[Network, ...] = ()
    events_ping_s: float = DEFAULT_EVENTS_PING_S  # PROTOCOL §15 (relay.http.routes.events)
    events_max_streams: int = DEFAULT_EVENTS_MAX_STREAMS
    # PROTOCOL §15, per process (relay.domain.stream_holders): streams plus held long-polls of
    # one key, one account, one client address; ENGRAM_RELAY_EVENTS_MAX_PER_KEY/_ACCOUNT/_ADDRESS
    events_max_per_key: int = DEFAULT_PER_KEY
    events_max_per_account: int = DEFAULT_PER_ACCOUNT
    events_max_per_address: int = DEFAULT_PER_ADDRESS
    live_feed: str = "on"  # one of LIVE_FEED_MODES (ENGRAM_RELAY_LIVE_FEED)
    scan_max_running: int = DEFAULT_SCAN_MAX_RUNNING  # ENGRAM_RELAY_SCAN_MAX_RUNNING
    scan_max_waiting: int = DEFAULT_SCAN_MAX_WAITING  # ENGRAM_RELAY_SCAN_MAX_WAITING
    scan_timeout_s: float = DEFAULT_SCAN_TIMEOUT_S  # ENGRAM_RELAY_SCAN_TIMEOUT_S
    # per vault and per client (key, account, address): relay.domain.scan_admission
    scan_vault_running: int = DEFAULT_VAULT_RUNNING  # ENGRAM_RELAY_SCAN_VAULT_RUNNING
    scan_vault_waiting: int = DEFAULT_VAULT_WAITING  # ENGRAM_RELAY_SCAN_VAULT_WAITING
    scan_max_per_client: int = DEFAULT_PER_CLIENT  # ENGRAM_RELAY_SCAN_MAX_PER_CLIENT
    # ENGRAM_RELAY_LISTEN_DATABASE_URL: where the process's one LISTEN connection goes
    # (PROTOCOL §15), when `database_url` is a transaction pooler (PgBouncer), through
    # which a LISTEN does not survive; None: `database_url` (deploy/SCALING.md §2).
    listen_database_url: str | None = field(default=None, repr=False)
    # Issue 34 (docs/web-vault.md "Served by the relay"): the web vault's bundle served at
    # /vault/ (ENGRAM_RELAY_WEB_VAULT=0 turns it off), from the installed package unless
    # ENGRAM_RELAY_WEB_VAULT_DIR names another folder (tests; `web verify` shows the change).
    web_vault: bool = True
    web_vault_dir: str | None = None

    def __post_init__(self) -> None:
        for name in ("quota_devices", "quota_bytes", "tombstone_retention_days"):
            if getattr(self, name) < 0:
                raise ValueError(f"{name} must be >= 0")
        for bad, why in _BOUNDS:
            if bad(self):
                raise ValueError(why)
        _ = self.stream_caps  # StreamCaps checks each cap, naming its variable
        problem = self.scan_limits.problem() or _named_values_problem(self)
        if problem:
            raise ValueError(problem)

    @property
    def scan_limits(self) -> ScanLimits:
        """The bounds of whole-vault scans (relay.domain.scan_admission)."""
        return ScanLimits(
            self.scan_max_running,
            self.scan_max_waiting,
            self.scan_vault_running,
            self.scan_vault_waiting,
            self.scan_max_per_client,
        )

    @property
    def stream_caps(self) -> StreamCaps:
        """The per-holder caps of streams and held long-polls (relay.domain.stream_holders)."""
        return StreamCaps(
            self.events_max_per_key, self.events_max_per_account, self.events_max_per_address
        )

    @property
    def listen_url(self) -> str:
        """The database URL of the LISTEN connection (PROTOCOL §15)."""
        return self.listen_database_url or self.database_url

    @property
    def feed_notify(self) -> bool:
        """Whether commits are announced (NOTIFY) and heard (LISTEN): PROTOCOL §15."""
        return self.live_feed != "off"

    @property
    def feed_events(self) -> bool:
        """Whether the event stream (GET /v1/vaults/{v}/events) is served."""
        return self.live_feed == "on"

    @property
    def lanes_in_use(self) -> int:
        """Push lanes, leaving at least one pooled connection to pulls and the rest."""
        return max(1, min(self.push_lanes, self.pool_max_size - 1))


def _env_int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ValueError(f"{name} must be an integer, got {raw!r}") from None


#: ENGRAM_RELAY_WEB_VAULT's values (case-insensitive); empty is on.
_SWITCH: Final = {"1": True, "on": True, "true": True, "0": False, "off": False, "false": False}


def env_switch(env: Mapping[str, str], name: str, default: bool) -> bool:
    """An on/off variable: 1/on/true or 0/off/false, empty or unset for `default`."""
    raw = env.get(name, "").strip().lower()
    if not raw:
        return default
    if raw not in _SWITCH:
        raise ValueError(f"{name} must be 1 or 0 (on or off), got {raw[:40]!r}")
    return _SWITCH[raw]


def _env_float(env: Mapping[str, str], name: str, default: float) -> float:
    raw = env.get(name, "").strip()
    if not raw:
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"{name} must be a number, got {raw!r}") from None


# long: one line per environment variable, read in one place
def config_from_env(
    database_url: str,
    env: Mapping[str, str] | None = None,
    **overrides: int | None,
) -> RelayConfig:
    """Build the config from `ENGRAM_RELAY_*` variables and `SYNC_API_KEYS`; overrides win."""
    source = os.environ if env is None else env
    values: dict[str, int] = {
        "quota_devices": _env_int(source, "ENGRAM_RELAY_QUOTA_DEVICES", 0),
        "quota_bytes": _env_int(source, "ENGRAM_RELAY_QUOTA_BYTES", 0),
        "max_blob_bytes": _env_int(source, "ENGRAM_RELAY_MAX_BLOB_BYTES", DEFAULT_MAX_BLOB_BYTES),
        "max_body_bytes": _env_int(source, "ENGRAM_RELAY_MAX_BODY_BYTES", DEFAULT_MAX_BODY_BYTES),
        "max_page_bytes": _env_int(source, "ENGRAM_RELAY_MAX_PAGE_BYTES", DEFAULT_MAX_PAGE_BYTES),
        "tombstone_retention_days": _env_int(
            source, "ENGRAM_RELAY_TOMBSTONE_RETENTION_DAYS", DEFAULT_RETENTION_DAYS
        ),
        "retire_grace_days": _env_int(
            source, "ENGRAM_RETIRE_GRACE_DAYS", DEFAULT_RETIRE_GRACE_DAYS
        ),
        "pool_max_size": _env_int(source, "ENGRAM_RELAY_POOL_SIZE", 10),
        "push_lanes": _env_int(source, "ENGRAM_RELAY_PUSH_LANES", DEFAULT_PUSH_LANES),
        "maintenance_interval_secs": _env_int(
            source, "ENGRAM_RELAY_MAINTENANCE_INTERVAL_S", DEFAULT_MAINTENANCE_INTERVAL_S
        ),
        "scrub_interval_secs": _env_int(
            source, "ENGRAM_RELAY_SCRUB_INTERVAL_S", DEFAULT_SCRUB_INTERVAL_S
        ),
        "scrub_per_round": _env_int(
            source, "ENGRAM_RELAY_SCRUB_PER_ROUND", DEFAULT_SCRUB_PER_ROUND
        ),
        "events_max_streams": _env_int(
            source, "ENGRAM_RELAY_EVENTS_MAX_STREAMS", DEFAULT_EVENTS_MAX_STREAMS
        ),
        "events_max_per_key": _env_int(source, ENV_PER_KEY, DEFAULT_PER_KEY),
        "events_max_per_account": _env_int(source, ENV_PER_ACCOUNT, DEFAULT_PER_ACCOUNT),
        "events_max_per_address": _env_int(source, ENV_PER_ADDRESS, DEFAULT_PER_ADDRESS),
        "scan_max_running": _env_int(
            source, "ENGRAM_RELAY_SCAN_MAX_RUNNING", DEFAULT_SCAN_MAX_RUNNING
        ),
        "scan_max_waiting": _env_int(
            source, "ENGRAM_RELAY_SCAN_MAX_WAITING", DEFAULT_SCAN_MAX_WAITING
        ),
        "scan_vault_running": _env_int(source, ENV_VAULT_RUNNING, DEFAULT_VAULT_RUNNING),
        "scan_vault_waiting": _env_int(source, ENV_VAULT_WAITING, DEFAULT_VAULT_WAITING),
        "scan_max_per_client": _env_int(source, ENV_PER_CLIENT, DEFAULT_PER_CLIENT),
    }
    values.update({k: v for k, v in overrides.items() if v is not None})
    return RelayConfig(
        database_url=database_url,
        static_keys=tuple(parse_static_keys(source.get("SYNC_API_KEYS", ""))),
        metrics_token=source.get("ENGRAM_RELAY_METRICS_TOKEN", "").strip() or None,
        trusted_proxies=parse_trusted_proxies(source.get(ENV_TRUSTED_PROXIES, "")),
        events_ping_s=_env_float(source, "ENGRAM_RELAY_EVENTS_PING_S", DEFAULT_EVENTS_PING_S),
        scan_timeout_s=_env_float(source, "ENGRAM_RELAY_SCAN_TIMEOUT_S", DEFAULT_SCAN_TIMEOUT_S),
        health_refresh_secs=_env_float(
            source, "ENGRAM_RELAY_HEALTH_REFRESH_S", DEFAULT_HEALTH_REFRESH_S
        ),
        live_feed=source.get("ENGRAM_RELAY_LIVE_FEED", "").strip().lower() or "on",
        listen_database_url=source.get("ENGRAM_RELAY_LISTEN_DATABASE_URL", "").strip() or None,
        web_vault=env_switch(source, "ENGRAM_RELAY_WEB_VAULT", True),
        web_vault_dir=source.get("ENGRAM_RELAY_WEB_VAULT_DIR", "").strip() or None,
        **values,
    )


#: RelayConfig's simple bounds: (is it out of bounds, the message naming its variable).
_BOUNDS: tuple[tuple[Callable[[RelayConfig], bool], str], ...] = (
    (
        lambda c: not 0 <= c.retire_grace_days <= 3650,
        "ENGRAM_RETIRE_GRACE_DAYS must be >= 0 and <= 3650 days",
    ),
    (
        lambda c: c.maintenance_interval_secs < 0,
        "ENGRAM_RELAY_MAINTENANCE_INTERVAL_S must be >= 0 (0 = off)",
    ),
    (lambda c: c.scrub_interval_secs < 0, "ENGRAM_RELAY_SCRUB_INTERVAL_S must be >= 0 (0 = off)"),
    (lambda c: c.scrub_per_round < 1, "ENGRAM_RELAY_SCRUB_PER_ROUND must be >= 1"),
    (
        lambda c: c.metrics_token is not None and len(c.metrics_token) < MIN_METRICS_TOKEN_CHARS,
        f"ENGRAM_RELAY_METRICS_TOKEN must be at least {MIN_METRICS_TOKEN_CHARS} "
        "characters (e.g. `openssl rand -hex 24`), or unset to serve no metrics",
    ),
    (
        lambda c: not 0 < c.health_refresh_secs <= 3600,
        "ENGRAM_RELAY_HEALTH_REFRESH_S must be > 0 and <= 3600 seconds",
    ),
    (
        lambda c: not 0 < c.events_ping_s <= 3600,
        "ENGRAM_RELAY_EVENTS_PING_S must be > 0 and <= 3600 seconds",
    ),
    (lambda c: c.events_max_streams < 1, "ENGRAM_RELAY_EVENTS_MAX_STREAMS must be >= 1"),
    (
        lambda c: not 0.001 <= c.scan_timeout_s <= 3600,
        "ENGRAM_RELAY_SCAN_TIMEOUT_S must be >= 0.001 and <= 3600 seconds",
    ),
    (lambda c: c.max_page_bytes < 1, "max_page_bytes must be >= 1"),
    (lambda c: c.push_lanes < 1, "push_lanes must be >= 1"),
    (
        lambda c: c.max_blob_bytes < DEFAULT_MAX_BLOB_BYTES,
        f"max_blob_bytes must be at least {DEFAULT_MAX_BLOB_BYTES} (PROTOCOL §6)",
    ),
    (
        lambda c: c.max_body_bytes < c.max_blob_bytes + 4096,
        "max_body_bytes must leave room for at least one maximal blob",
    ),
)


def _named_values_problem(config: RelayConfig) -> str | None:
    """What is wrong with the settings that name a value (a mode, a URL), if anything."""
    if config.live_feed not in LIVE_FEED_MODES:
        return (
            f"ENGRAM_RELAY_LIVE_FEED must be one of {', '.join(LIVE_FEED_MODES)}, "
            f"got {config.live_feed!r}"
        )
    if config.listen_database_url is not None:
        try:
            to_libpq_url(config.listen_database_url)
        except ValueError as exc:
            return f"ENGRAM_RELAY_LISTEN_DATABASE_URL: {exc}"
    return None
