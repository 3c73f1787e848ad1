#!/bin/sh
# Entrypoint of the Engram Sync relay container; it also runs as is outside one
# (`sh deploy/entrypoint.sh`, with engram-relay and python3 on PATH).
#
#   1. needs a database URL: ENGRAM_RELAY_DATABASE_URL or DATABASE_URL (the
#      relay's own precedence); the embedded PostgreSQL is not used here
#   2. waits until that database accepts connections, at most
#      ENGRAM_RELAY_DB_WAIT_SECS seconds (default 60), trying every
#      ENGRAM_RELAY_DB_WAIT_INTERVAL seconds (default 2); a wrong password or a
#      missing database fails at once
#   3. applies the migrations (forward-only): `engram-relay migrate`
#   4. execs `engram-relay serve`, so the relay gets SIGTERM itself
#
# Arguments starting with "-" are extra `serve` options. Any other arguments
# are a command run after step 2 instead of 3-4, e.g.
#   docker compose run --rm relay engram-relay keys list
# Configuration is environment only: every variable is in deploy/.env.example.
# The database URL is never logged with its password, nor put on a command line.
set -eu

log() {
	printf '%s entrypoint: %s\n' "$(date -u '+%Y-%m-%dT%H:%M:%SZ')" "$*" >&2
}

die() {
	log "error: $*"
	exit 1
}

# Fail unless $2, the value of the variable named $1, is a whole number.
check_number() {
	case $2 in
	'' | *[!0-9]*) die "$1 must be a whole number, got '$2'" ;;
	esac
}

PYTHON=${ENGRAM_RELAY_PYTHON:-python3}

# `db_helper describe` prints the URL with its password redacted; `db_helper probe`
# connects once and exits 0 (up), 1 (not yet: retry) or 2 (never: wrong password,
# no such database, not a PostgreSQL URL), printing the reason.
db_helper() {
	"$PYTHON" - "$1" <<'PY'
import asyncio
import os
import sys

try:
    import asyncpg

    from engram_sync.relay.db.url import redact_url, to_libpq_url
except ImportError as exc:
    print(f"the relay is not installed for {sys.executable}: {exc}")
    sys.exit(2)

url = os.environ["ENGRAM_RELAY_ENTRYPOINT_URL"]
if sys.argv[1] == "describe":
    print(redact_url(url))
    sys.exit(0)


async def probe() -> None:
    conn = await asyncpg.connect(to_libpq_url(url), timeout=5)
    try:
        await conn.fetchval("SELECT 1")
    finally:
        await conn.close()


try:
    asyncio.run(probe())
except (
    ValueError,
    asyncpg.InvalidAuthorizationSpecificationError,
    asyncpg.InvalidCatalogNameError,
) as exc:
    print(f"{type(exc).__name__}: {exc}".splitlines()[0])
    sys.exit(2)
except Exception as exc:
    print(f"{type(exc).__name__}: {exc}".splitlines()[0] if str(exc) else type(exc).__name__)
    sys.exit(1)
PY
}

ENGRAM_RELAY_ENTRYPOINT_URL=${ENGRAM_RELAY_DATABASE_URL:-${DATABASE_URL:-}}
if [ -z "$ENGRAM_RELAY_ENTRYPOINT_URL" ]; then
	die "DATABASE_URL is not set: set it (or ENGRAM_RELAY_DATABASE_URL) to postgresql://user:password@host:5432/database"
fi
export ENGRAM_RELAY_ENTRYPOINT_URL

wait_secs=${ENGRAM_RELAY_DB_WAIT_SECS:-60}
check_number ENGRAM_RELAY_DB_WAIT_SECS "$wait_secs"
interval=${ENGRAM_RELAY_DB_WAIT_INTERVAL:-2}
check_number ENGRAM_RELAY_DB_WAIT_INTERVAL "$interval"
[ "$interval" -ge 1 ] || interval=1
target=$(db_helper describe) || die "$target"

log "waiting for the database at $target (up to ${wait_secs}s)"
started=$(date +%s)
attempt=1
while :; do
	rc=0
	reason=$(db_helper probe) || rc=$?
	[ "$rc" -eq 0 ] && break
	if [ "$rc" -ne 1 ]; then
		die "cannot use the database at $target: $reason"
	fi
	elapsed=$(($(date +%s) - started))
	if [ "$elapsed" -ge "$wait_secs" ]; then
		die "the database at $target is not reachable after ${elapsed}s ($attempt attempts; last: $reason); check that it is running and that the URL is right, or raise ENGRAM_RELAY_DB_WAIT_SECS"
	fi
	log "database not reachable yet (attempt $attempt: $reason); retrying in ${interval}s"
	attempt=$((attempt + 1))
	sleep "$interval"
done
log "database is up"
unset ENGRAM_RELAY_ENTRYPOINT_URL

if [ "$#" -gt 0 ]; then
	case $1 in
	-*) ;;
	*)
		log "running: $1"
		exec "$@"
		;;
	esac
fi

data_dir=${ENGRAM_RELAY_DATA_DIR:-/data}
(umask 077 && mkdir -p "$data_dir") 2>/dev/null || true
if [ ! -d "$data_dir" ] || [ ! -w "$data_dir" ]; then
	die "the data dir $data_dir is not writable by uid $(id -u): mount a volume there that this user owns (ENGRAM_RELAY_DATA_DIR)"
fi

log "applying migrations (forward-only)"
engram-relay migrate || die "migrations failed (see above); the relay was not started"

host=${ENGRAM_RELAY_HOST:-0.0.0.0}
port=${ENGRAM_RELAY_PORT:-8788}
check_number ENGRAM_RELAY_PORT "$port"
log "starting the relay on $host:$port (data dir $data_dir)"
exec engram-relay serve \
	--host "$host" \
	--port "$port" \
	--data-dir "$data_dir" \
	--log-level "${ENGRAM_RELAY_LOG_LEVEL:-info}" \
	--log-format "${ENGRAM_RELAY_LOG_FORMAT:-json}" \
	"$@"
