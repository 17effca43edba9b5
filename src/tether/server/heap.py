"""Keeping the garbage collector off a server's hot path.

By the time ``tether serve`` listens, its process holds ~150,000 container objects that live as
long as it does (the openai SDK's and FastAPI's classes, pydantic schemas, the routes, a model's
tables), and CPython's collector walks all of them on every full collection. A turn also makes
short bursts of objects (a request body of a few hundred dicts) that die moments later, and
each burst past the young generation's threshold (700 by default) starts a collection that
finds nothing to free. Measured under load (64 sessions, 0 ms fake model, 10 s, collection
times from ``gc.callbacks``): 7 full collections at ~145 ms each and 830 young ones, 0.66 ms of
a turn's 4.0 ms of CPU. Freezing what exists at start (it is still freed by reference counting
if it ever goes) and a young threshold of 10,000: 0.05-0.09 ms a turn.

A higher threshold also lets cyclic garbage wait longer before it is freed: at most that many
objects (RSS per idle session, ``bench/hot_path.py``, stayed 0 KB).

Only the server's own process does this (``tether serve`` and each of its workers): an
application that embeds tether keeps its own collector settings.
"""

from __future__ import annotations

import gc

FIRST_GENERATION_THRESHOLD = 10_000
"""Allocations (less frees) of container objects between young collections (CPython: 700)."""


def settle() -> None:
    """Collect once, freeze what survives, and raise the young threshold; the older ones keep
    CPython's defaults."""
    gc.collect()
    gc.freeze()
    _, second, third = gc.get_threshold()
    gc.set_threshold(FIRST_GENERATION_THRESHOLD, second, third)
