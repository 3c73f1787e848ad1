"""Every setting of deploy/.env.example reaches the container that reads it.

A variable set in `.env` only reaches a container when docker-compose.yml passes it
(`NAME: ${NAME:-default}` in the service's environment); before these checks,
ENGRAM_RELAY_DB_WAIT_INTERVAL and ENGRAM_RELAY_HOST were documented but dropped.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.support import ROOT, child_env
from tests.deploy.test_deploy_files import (
    COMPOSE,
    DOCKERFILE,
    ENV_EXAMPLE,
    SETTING_READERS,
    compose_command,
    instructions,
    run,
)

_ASSIGNMENT = re.compile(r"^(#\s*)?([A-Z][A-Z0-9_]*)=(\S*)")
#: Read by docker compose itself, not by a container.
COMPOSE_OWN = {"COMPOSE_PROFILES"}
#: Interpolated into other values of docker-compose.yml (DATABASE_URL, the port mapping).
INTERPOLATED = {"POSTGRES_USER", "POSTGRES_PASSWORD", "POSTGRES_DB",
                "RELAY_PUBLISH_ADDR", "RELAY_PUBLISH_PORT"}  # fmt: skip
#: Read by the entrypoint only when it runs outside the image (its default is right there).
OUTSIDE_THE_IMAGE = {"ENGRAM_RELAY_PYTHON"}
#: Internal to the entrypoint (never configured).
INTERNAL = {"ENGRAM_RELAY_ENTRYPOINT_URL"}


def example_assignments() -> tuple[dict[str, str], set[str]]:
    """(active NAME -> value, names only shown commented out) of deploy/.env.example."""
    active: dict[str, str] = {}
    commented: set[str] = set()
    for line in ENV_EXAMPLE.read_text(encoding="utf-8").splitlines():
        match = _ASSIGNMENT.match(line)
        if match is None:
            continue
        if match.group(1):
            commented.add(match.group(2))
        else:
            active[match.group(2)] = match.group(3)
    return active, commented


def compose_spec() -> dict[str, Any]:
    yaml = pytest.importorskip("yaml")
    spec: dict[str, Any] = yaml.safe_load(COMPOSE.read_text(encoding="utf-8"))
    return spec


def passed_through(spec: dict[str, Any]) -> dict[str, str]:
    """NAME -> service for each `NAME: ${NAME...}` of a service's environment."""
    found: dict[str, str] = {}
    for service, body in spec["services"].items():
        for name, value in (body.get("environment") or {}).items():
            if re.match(rf"\$\{{{name}(:?[-?][^}}]*)?\}}$", str(value)):
                found[name] = service
    return found


def image_env() -> set[str]:
    """Variables the Dockerfile sets with ENV."""
    names: set[str] = set()
    for keyword, args in instructions(DOCKERFILE):
        if keyword == "ENV":
            names |= set(re.findall(r"([A-Z][A-Z0-9_]*)=", args))
    return names


def container_variables() -> set[str]:
    """ENGRAM_RELAY_* the relay container reads: the relay's settings, the entrypoint's
    and the health check's."""
    pattern = re.compile(r"\bENGRAM_RELAY_[A-Z0-9_]*[A-Z0-9]\b")
    return {
        m for path in SETTING_READERS for m in pattern.findall(path.read_text(encoding="utf-8"))
    }


def test_every_active_setting_of_the_example_reaches_a_container_or_compose() -> None:
    spec = compose_spec()
    passed = passed_through(spec)
    text = COMPOSE.read_text(encoding="utf-8")
    active, _ = example_assignments()
    assert {"ENGRAM_RELAY_DB_WAIT_INTERVAL", "ENGRAM_RELAY_HOST", "SYNC_API_KEYS"} <= active.keys()
    for name in active:
        if name in COMPOSE_OWN:
            continue
        if name in INTERPOLATED:
            assert "${" + name in text, f"{name} is never used by docker-compose.yml"
            continue
        assert name in passed, f"{name} is in deploy/.env.example but docker-compose.yml drops it"
    assert passed["ENGRAM_RELAY_DOMAIN"] == "caddy"
    assert passed["ENGRAM_RELAY_DB_WAIT_INTERVAL"] == passed["ENGRAM_RELAY_HOST"] == "relay"


def test_every_variable_the_container_reads_is_passed_or_set_by_the_image() -> None:
    passed = passed_through(compose_spec())
    set_by_image = image_env()
    _, commented = example_assignments()
    # DATABASE_URL is built by compose; ENGRAM_RELAY_DATABASE_URL, when set, wins.
    assert {"DATABASE_URL", "ENGRAM_RELAY_DATABASE_URL"} <= compose_spec()["services"]["relay"][
        "environment"
    ].keys()
    for name in sorted(container_variables() - INTERNAL - OUTSIDE_THE_IMAGE):
        if name in set_by_image:
            # Fixed by the image (the port mapping targets 8788, /data is the volume):
            # the example shows them commented out, under "Set by the image".
            assert name in commented, f"{name} is set by the image: show it commented out"
            assert name not in passed
            continue
        assert name in passed, f"the relay container reads {name} but docker-compose.yml drops it"
    # What the example shows commented out is the image's or the entrypoint's own.
    assert commented <= set_by_image | OUTSIDE_THE_IMAGE | COMPOSE_OWN, commented


def test_compose_config_hands_the_values_of_the_env_file_to_the_relay(tmp_path: Path) -> None:
    compose = compose_command()
    if compose is None:
        pytest.skip("neither `docker compose` nor docker-compose v2+ works here; static checks ran")
    active, _ = example_assignments()
    values = dict(active)
    values.update(POSTGRES_PASSWORD="0123456789abcdef", ENGRAM_RELAY_DOMAIN="relay.example.com")
    markers: dict[str, str] = {}
    for name in active:
        if name.startswith("ENGRAM_RELAY_") and name != "ENGRAM_RELAY_DOMAIN":
            markers[name] = values[name] = f"set-in-env-file-{name.lower()}"
    values["ENGRAM_RELAY_HOST"] = markers["ENGRAM_RELAY_HOST"] = "::"
    env_file = tmp_path / ".env"
    env_file.write_text("".join(f"{k}={v}\n" for k, v in values.items()), encoding="utf-8")
    base = [*compose, "--project-directory", str(ROOT), "-f", str(COMPOSE)]
    result = run(
        [*base, "--env-file", str(env_file), "--profile", "tls", "config", "--format", "json"],
        env=child_env(),
    )
    assert result.returncode == 0, result.stderr
    relay_env = json.loads(result.stdout)["services"]["relay"]["environment"]
    assert markers
    for name, marker in markers.items():
        assert relay_env.get(name) == marker, f"{name}: {relay_env.get(name)!r}"
