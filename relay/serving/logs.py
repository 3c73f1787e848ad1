"""Structured logging for the relay: one JSON object per line (or plain text).

Fields passed with `extra=` are included; nothing here ever formats a key,
a ciphertext or an HMAC — callers log key prefixes only.
"""

from __future__ import annotations

import json
import logging
import re
import sys
from datetime import UTC, datetime
from typing import Any, Final

from engram_sync.relay.serving.request_context import RequestIdFilter

_STANDARD: Final = frozenset(
    logging.LogRecord("", 0, "", 0, "", (), None).__dict__.keys() | {"message", "asctime"}
)


# issue 17: uvicorn passes a coloured copy of some messages as `color_message`; a log line
# is for machines, so it is dropped, and escape sequences in a message are removed.
_DROPPED: Final = frozenset({"color_message"})
_ANSI: Final = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]")


class JsonFormatter(logging.Formatter):
    """`{"ts","level","logger","msg",...extra}` per line: plain JSON, no ANSI escapes;
    `request_id` only on lines written while serving a request (relay.serving.request_context)."""

    def format(self, record: logging.LogRecord) -> str:
        payload: dict[str, Any] = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="milliseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": _ANSI.sub("", record.getMessage()),
        }
        for key, value in record.__dict__.items():
            if key in _STANDARD or key in _DROPPED or key.startswith("_"):
                continue
            if value is None:
                if key != "request_id":  # outside a request: no field, not "None"
                    payload[key] = None
                continue
            payload[key] = value if isinstance(value, str | int | float | bool) else str(value)
        if record.exc_info:
            payload["exc"] = self.formatException(record.exc_info)
        return json.dumps(payload, ensure_ascii=False)


def configure_logging(level: str = "info", fmt: str = "json") -> None:
    """Route every logger to stderr in the chosen format."""
    handler = logging.StreamHandler(sys.stderr)
    if fmt == "json":
        handler.setFormatter(JsonFormatter())
    else:
        handler.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    handler.addFilter(RequestIdFilter())
    root = logging.getLogger()
    root.handlers[:] = [handler]
    root.setLevel(level.upper())
    for noisy in ("httpx", "alembic.runtime.migration"):
        logging.getLogger(noisy).setLevel(max(logging.WARNING, root.level))
