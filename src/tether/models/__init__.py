"""Model providers behind one small protocol, and the spec strings that name them.

Spec strings: ``local`` (the embedded model, the default: SmolLM2-135M-Instruct),
``local:smollm2``, ``local:gemma3`` (Gemma 3 270M, when its wheels are installed),
``openai:<model>``, ``ollama:<model>``. Model instances are shared per process: one loaded
local model serves every session.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterable

from tether.errors import ConfigError
from tether.models.base import (
    Finish,
    Message,
    Model,
    ModelEvent,
    ModelRequest,
    TextDelta,
    ToolCall,
    ToolCallDelta,
    ToolSpec,
    Usage,
)

__all__ = [
    "Finish",
    "Message",
    "Model",
    "ModelEvent",
    "ModelRequest",
    "TextDelta",
    "ToolCall",
    "ToolCallDelta",
    "ToolSpec",
    "Usage",
    "default_model_spec",
    "resolve_model",
]

OLLAMA_BASE_URL = "http://127.0.0.1:11434/v1"

_cache: dict[str, Model] = {}
_cache_lock = threading.Lock()


def default_model_spec() -> str:
    """``TETHER_MODEL`` when set, else the embedded ``local`` model."""
    return os.environ.get("TETHER_MODEL") or "local"


def resolve_model(spec: str | Model | None) -> Model:
    """Turn a spec string (or ``None`` for the default) into a shared model instance."""
    if spec is None:
        spec = default_model_spec()
    if not isinstance(spec, str):
        return spec
    with _cache_lock:
        model = _cache.get(spec)
        if model is None:
            model = _build(spec)
            _cache[spec] = model
        return model


async def close_models(models: Iterable[str | Model | None]) -> None:
    """Close the connections of these models (specs, objects, or None for the default) that
    were made on the running loop. A spec never used is not built for this."""
    seen: dict[int, Model] = {}
    for m in models:
        if m is None:
            m = default_model_spec()
        if isinstance(m, str):
            with _cache_lock:
                found = _cache.get(m)
            if found is None:
                continue
            m = found
        seen[id(m)] = m
    for model in seen.values():
        close = getattr(model, "aclose", None)
        if close is not None:
            await close()


def _build(spec: str) -> Model:
    provider, _, name = spec.partition(":")
    if provider == "local":
        from tether.models.local import LocalModel

        return LocalModel(name or None)
    if provider == "openai":
        from tether.models.openai import OpenAIModel

        if not name:
            raise ConfigError("model spec 'openai:' needs a model name, e.g. openai:gpt-4o-mini")
        return OpenAIModel(name)
    if provider == "ollama":
        from tether.models.openai import OpenAIModel

        if not name:
            raise ConfigError("model spec 'ollama:' needs a model name, e.g. ollama:llama3.2")
        base_url = os.environ.get("OLLAMA_BASE_URL", OLLAMA_BASE_URL)
        return OpenAIModel(name, base_url=base_url, api_key="ollama", label=f"ollama:{name}")
    raise ConfigError(
        f"unknown model spec {spec!r}: use 'local', 'local:<embedded model>', 'openai:<model>' or "
        "'ollama:<model>'"
    )
