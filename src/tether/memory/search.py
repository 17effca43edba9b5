"""Hybrid search: lexical ranks from the store, vector ranks from an in-memory matrix, fused.

Vectors: per namespace and collection, the store hands out every embedding with a version; the
matrix is rebuilt only when that version moves (one cheap read per search otherwise), and a
search is one matrix-vector product. At 100k records of 256 floats that is a 100 MB matrix and a
few milliseconds; a namespace is one user's or one agent's memory, so most are far smaller.

Fusion: reciprocal rank fusion (each list contributes ``1 / (k + rank)``), which needs no
calibration between BM25 scores and cosine similarities.
"""

from __future__ import annotations

import asyncio
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt
from threadpoolctl import ThreadpoolController  # type: ignore[import-untyped]

from tether.memory.embed import Vectors
from tether.records import Namespace
from tether.store.protocol import RecallStore

RRF_K = 60
OFF_LOOP_ROWS = 20_000
MAX_TERMS = 32
_WORD = re.compile(r"[^\W_]+", re.UNICODE)


def query_terms(text: str) -> list[str]:
    """Distinct lower-case words of ``text`` (letters and digits only), at most MAX_TERMS."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(text.lower()):
        if len(seen) >= MAX_TERMS:
            break
        seen.setdefault(word[:64], None)
    return list(seen)


def fuse(rankings: Sequence[Sequence[int]], k: int = RRF_K) -> list[tuple[int, float]]:
    """Reciprocal rank fusion of lists of ids (best first) → ``(id, score)``, best first."""
    scores: dict[int, float] = {}
    for ranking in rankings:
        for rank, seq in enumerate(ranking):
            scores[seq] = scores.get(seq, 0.0) + 1.0 / (k + rank + 1)
    return sorted(scores.items(), key=lambda kv: (-kv[1], -kv[0]))


@dataclass
class _Matrix:
    version: int
    seqs: npt.NDArray[np.int64]
    vectors: Vectors

    @property
    def nbytes(self) -> int:
        return int(self.vectors.nbytes + self.seqs.nbytes)


class VectorIndex:
    """Cached embedding matrices, one per (namespace, collection), bounded in total bytes."""

    def __init__(self, max_bytes: int = 512 * 1024 * 1024) -> None:
        self.max_bytes = max_bytes
        self._cache: OrderedDict[tuple[str, str], _Matrix] = OrderedDict()
        self._bytes = 0
        self._loading: dict[tuple[str, str], asyncio.Lock] = {}

    def forget(self, ns: Namespace) -> None:
        for key in [k for k in self._cache if k[0] == ns.key]:
            self._bytes -= self._cache.pop(key).nbytes

    async def _matrix(
        self, store: RecallStore, ns: Namespace, collection: str, version: int
    ) -> _Matrix:
        key = (ns.key, collection)
        cached = self._cache.get(key)
        if cached is not None and cached.version == version:
            self._cache.move_to_end(key)
            return cached
        # One load per namespace at a time: a burst of searches after a write shares it.
        lock = self._loading.setdefault(key, asyncio.Lock())
        async with lock:
            cached = self._cache.get(key)
            if cached is not None and cached.version == version:
                return cached
            snap = await store.load_vectors(ns, collection=collection)
            matrix = _build(snap.version, snap.seqs, snap.vectors)
            if cached is not None:
                self._bytes -= cached.nbytes
            self._cache[key] = matrix
            self._bytes += matrix.nbytes
            while self._bytes > self.max_bytes and len(self._cache) > 1:
                _, old = self._cache.popitem(last=False)
                self._bytes -= old.nbytes
            return matrix

    async def nearest(
        self,
        store: RecallStore,
        versions: Sequence[tuple[Namespace, int]],
        collection: str,
        query: Vectors,
        limit: int,
    ) -> list[tuple[int, float]]:
        """``(seq, cosine)`` of the ``limit`` nearest records over the namespaces (each with the
        version just read for it), best first."""
        q = np.asarray(query, dtype=np.float32).reshape(-1)
        found: list[tuple[int, float]] = []
        for ns, version in versions:
            if version == 0:
                continue  # never written: nothing to load
            m = await self._matrix(store, ns, collection, version)
            if len(m.seqs) == 0 or m.vectors.shape[1] != q.shape[0]:
                continue
            if len(m.seqs) > OFF_LOOP_ROWS:
                # Milliseconds of arithmetic: off the event loop, so other turns go on, and
                # with BLAS's own threads (at 100k rows 6 ms with two against 11 with one).
                found.extend(await asyncio.to_thread(_top, m, q, limit, None))
            else:
                found.extend(_top(m, q, limit, 1))
        found.sort(key=lambda kv: -kv[1])
        return found[:limit]


def _top(m: _Matrix, q: Vectors, limit: int, threads: int | None) -> list[tuple[int, float]]:
    # One BLAS thread for small matrices: the product gains little from more, and OpenBLAS's
    # idle threads spin on a busy host (measured at 10k rows: 8 ms with its default threads
    # against 0.4 ms with one, and most of a turn's CPU).
    if threads is None:
        scores = m.vectors @ q
    else:
        with _blas().limit(limits=threads, user_api="blas"):
            scores = m.vectors @ q
    take = min(limit, len(scores))
    top = np.argpartition(-scores, take - 1)[:take]
    return [(int(m.seqs[i]), float(scores[i])) for i in top]


_controller: ThreadpoolController | None = None


def _blas() -> ThreadpoolController:
    global _controller
    if _controller is None:  # scanning the loaded libraries takes a moment: once
        _controller = ThreadpoolController()
    return _controller


def _build(version: int, seqs: Sequence[int], blobs: Sequence[bytes]) -> _Matrix:
    if not blobs:
        return _Matrix(version, np.zeros(0, np.int64), np.zeros((0, 0), np.float32))
    # Records embedded by another embedder (another width) cannot be compared: keep the most
    # common width, leave the rest out of vector search (they still match lexically).
    widths: dict[int, int] = {}
    for b in blobs:
        widths[len(b)] = widths.get(len(b), 0) + 1
    width = max(widths, key=lambda w: widths[w])
    keep = [i for i, b in enumerate(blobs) if len(b) == width and width > 0]
    if not keep:
        return _Matrix(version, np.zeros(0, np.int64), np.zeros((0, 0), np.float32))
    data = b"".join(blobs[i] for i in keep)
    vectors = np.frombuffer(data, dtype=np.float32).reshape(len(keep), width // 4).copy()
    return _Matrix(version, np.array([seqs[i] for i in keep], dtype=np.int64), vectors)
