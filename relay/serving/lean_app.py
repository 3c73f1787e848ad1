"""Litestar without the plugins the relay never uses (issue 36: the relay's idle RSS).

Litestar adds a plugin for every optional model library it finds installed (pydantic,
attrs), importing that library when the app is built. The relay's bodies are msgspec
structs only, so those plugins serve nothing, yet they cost every relay process about
10 MiB (pydantic is installed next to the relay: deploy/constraints.txt). `LeanLitestar`
keeps Litestar's one core default, the msgspec dependency-injection plugin, and adds no
other. tests/relay/serving/test_serving.py checks that building the app imports neither
library, and `python -m bench` reports the relay processes' RSS at rest.
"""

from __future__ import annotations

from litestar import Litestar
from litestar.plugins import PluginProtocol
from litestar.plugins.core import MsgspecDIPlugin


class LeanLitestar(Litestar):
    """`Litestar` whose default plugins are the msgspec one alone."""

    @staticmethod
    def _get_default_plugins(plugins: list[PluginProtocol]) -> list[PluginProtocol]:
        plugins.append(MsgspecDIPlugin())
        return plugins
