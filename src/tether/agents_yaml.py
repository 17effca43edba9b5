"""Agents from a YAML file, for people who do not write Python::

agents:
  - name: support
    instructions: You answer questions about our product.
    model: openai:gpt-4o-mini      # optional; default TETHER_MODEL, else local
    max_iterations: 5              # optional
    on_max_iterations: ask         # optional: stop (default), ask or finish
    ask_user: true                 # optional: offer the ask_user tool
    handoffs: [billing]            # optional: agents of this file it may pass a chat to
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from tether.agent import Agent
from tether.errors import ConfigError

_ALLOWED = {
    "name",
    "instructions",
    "model",
    "max_iterations",
    "on_max_iterations",
    "max_total_iterations",
    "ask_user",
    "approval_timeout",
    "token_budget",
    "context_budget",
    "max_output_tokens",
    "temperature",
    "description",
    "memory",
    "handoffs",
    "role",
    "goal",
    "backstory",
}


def load_yaml_agents(path: Path) -> list[Agent]:
    try:
        data = yaml.safe_load(path.read_text())
    except OSError as exc:
        raise ConfigError(f"cannot read {path}: {exc.strerror}") from exc
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path} is not valid YAML: {exc}") from exc
    entries: Any = data.get("agents") if isinstance(data, dict) else data
    if not isinstance(entries, list) or not entries:
        raise ConfigError(f"{path}: expected a non-empty list under 'agents:'")
    agents = []
    for n, entry in enumerate(entries, 1):
        if not isinstance(entry, dict) or not isinstance(entry.get("name"), str):
            raise ConfigError(f"{path}: agent #{n} needs at least a 'name'")
        unknown = set(entry) - _ALLOWED
        if unknown:
            raise ConfigError(
                f"{path}: agent {entry['name']!r} has unknown keys: {', '.join(sorted(unknown))}"
            )
        options = {k: v for k, v in entry.items() if k not in {"role", "goal", "backstory"}}
        # PraisonAI-style role/goal/backstory become instructions when none are given.
        if "instructions" not in options:
            parts = [
                f"{k.capitalize()}: {entry[k]}"
                for k in ("role", "goal", "backstory")
                if entry.get(k)
            ]
            if parts:
                options["instructions"] = "\n".join(parts)
        try:
            agents.append(Agent(**options))
        except TypeError as exc:
            raise ConfigError(f"{path}: agent {entry['name']!r}: {exc}") from exc
    return agents
