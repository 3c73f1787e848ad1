"""The image is built from exact pins: deploy/constraints.txt covers every runtime
dependency of pyproject.toml and everything they need, and the Dockerfile uses it."""

from __future__ import annotations

import re
from importlib import metadata
from pathlib import Path
from types import ModuleType

from packaging.requirements import Requirement
from packaging.utils import canonicalize_name

from tests.deploy.support import DEPLOY, load_script
from tests.deploy.test_deploy_files import DOCKERFILE, copied_sources, instructions

CONSTRAINTS = DEPLOY / "constraints.txt"
_PIN = re.compile(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)")


def freezer() -> ModuleType:
    return load_script(DEPLOY / "freeze_constraints.py", "freeze")


def pins(path: Path = CONSTRAINTS) -> dict[str, str]:
    """Canonical name -> pinned version; every non-comment line must be `name==version`."""
    found: dict[str, str] = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if not line.strip() or line.startswith("#"):
            continue
        match = _PIN.fullmatch(line.strip())
        assert match, f"not an exact pin: {line!r}"
        name = canonicalize_name(match.group(1))
        assert name not in found, f"{name} pinned twice"
        found[name] = match.group(2)
    return found


def test_every_runtime_dependency_is_pinned_within_its_range() -> None:
    pinned = pins()
    requirements = freezer().runtime_requirements()
    assert len(requirements) >= 10
    for requirement in requirements:
        name = canonicalize_name(requirement.name)
        assert name in pinned, f"{requirement} has no pin in deploy/constraints.txt"
        assert requirement.specifier.contains(pinned[name], prereleases=True), (
            f"{name}=={pinned[name]} does not satisfy pyproject.toml's {requirement}"
        )
    # Test and bench extras stay out of the image.
    for extra_only in ("pytest", "hypothesis", "mypy", "ruff", "schemathesis", "matplotlib"):
        assert extra_only not in pinned, extra_only


def test_the_pins_are_a_closed_set() -> None:
    """Every package a pinned package needs (its extras' too, markers for this
    interpreter) is pinned as well: nothing of the closure floats."""
    pinned = pins()
    module = freezer()
    requested: dict[str, set[str]] = {}
    for requirement in module.runtime_requirements():
        requested.setdefault(canonicalize_name(requirement.name), set()).update(requirement.extras)
    missing: list[str] = []
    for name in pinned:
        dist = metadata.distribution(name)
        for text in dist.requires or ():
            child = Requirement(text)
            if module.applies(child, requested.get(name, set())):
                requested.setdefault(canonicalize_name(child.name), set()).update(child.extras)
                if canonicalize_name(child.name) not in pinned:
                    missing.append(f"{name} needs {child}")
    assert not missing, "unpinned: " + "; ".join(missing)


def test_the_closure_of_a_requirement_follows_extras_and_markers() -> None:
    """The generator on this environment: uvicorn[standard] brings uvloop and httptools,
    plain uvicorn does not; a marker for another interpreter is left out."""
    module = freezer()
    with_extra = module.closure([Requirement("uvicorn[standard]")])
    plain = module.closure([Requirement("uvicorn")])
    assert {"uvicorn", "h11", "httptools", "uvloop"} <= with_extra.keys()
    assert "httptools" not in plain
    assert "uvicorn" in plain
    assert module.closure([Requirement("uvicorn; python_version < '3.0'")]) == {}
    assert with_extra["uvicorn"] == metadata.version("uvicorn")


def test_constraints_file_is_what_the_generator_writes_for_its_pins() -> None:
    module = freezer()
    text = CONSTRAINTS.read_text(encoding="utf-8")
    assert "deploy/freeze_constraints.py" in text.splitlines()[2]
    body = [line for line in text.splitlines() if not line.startswith("#")]
    rendered = module.render(pins())
    assert body == [line for line in rendered.splitlines() if not line.startswith("#")]


def test_dockerfile_installs_under_the_constraints() -> None:
    steps = instructions(DOCKERFILE)
    runs = [args for keyword, args in steps if keyword == "RUN"]
    installs = [r for r in runs if "pip install" in r and "--no-deps" not in r]
    assert installs, "no pip install of the runtime dependencies"
    for run in installs:
        assert re.search(r"pip install [^&]*-c deploy/constraints\.txt", run), run
    copied = [(sources, dest) for sources, dest in copied_sources()]
    assert any("deploy/constraints.txt" in sources for sources, _ in copied)
    # The constraints arrive before the install that reads them.
    order = [args for keyword, args in steps if keyword in ("COPY", "RUN")]
    copy_at = next(i for i, a in enumerate(order) if "deploy/constraints.txt" in a)
    install_at = next(i for i, a in enumerate(order) if "-c deploy/constraints.txt" in a)
    assert copy_at < install_at
