"""Memory: recall latency, embedding throughput, knowledge ingestion and recall's share of a turn.

Reproduce (from the repository root; PostgreSQL on 127.0.0.1:5432, trust auth, user postgres)::

    .venv/bin/python bench/memory.py                # full run, < 6 min on 2 cores
    .venv/bin/python bench/memory.py --quick        # 1k and 10k items, fewer queries: < 1 min
    .venv/bin/python bench/memory.py --no-postgres  # recall on SQLite only
    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/memory.py   # numpy's BLAS on one thread

The memory items are generated "facts" (10-40 words, from word lists: relatives, places, hobbies,
allergies, appointments, projects…), half in the third person ("The user's sister…"), half in
the first ("My sister…"); about a third carry a rare word (a made-up project or pet name, a
membership code). Questions come in three kinds: *rare* (names a rare word of an item),
*paraphrase* (asks about an item in other words: "sibling" for "sister", "relocate" for "moved")
and *chatty* (mostly stop words, perhaps one common word). Everything is seeded: every run
searches the same items with the same questions.

1. **Recall**: ``MemoryService.search([user namespace], question, limit=5)``, what a turn does
   before the model runs (version read, lexical half in the store, query embedding, vector half
   over the cached numpy matrix, reciprocal rank fusion, records by seq), one query at a time,
   with 1k, 10k and 100k items in ONE namespace, on SQLite (a temporary file) and PostgreSQL (a
   fresh ``tether_bench_mem_<pid>``, dropped at the end). The store grows from one size to the
   next. SQLite is filled with ``put_memory``, a few hundred calls gathered at a time;
   PostgreSQL too for its first 1,000 items, then through the store's own ``insert`` in
   transactions of 1,000 (there ``put_memory`` is a transaction per record, and all of them
   update the namespace's one version row, so they queue). After each fill PostgreSQL gets a
   ``VACUUM ANALYZE``, as autovacuum would give a live database; the lexical half is also timed
   once before it, at the first size. *Warm* rows: every search after the first, matrix cached.
   The parts are timed alone right after each full search: ``store.lexical_search`` (50
   candidates), the query's embedding, ``index.nearest`` (50 candidates), and
   ``store.memory_by_seq`` of the hits. Matrix loads: the first search of a fresh service, and a
   warm service's first search after one ``put_memory`` to the namespace; medians of 3.
2. **Embedding**: ``WordLlamaEmbedder.embed_sync`` on 5-15-word texts, batches of 1, 32, 256,
   in a child process pinned to core 0 (``os.sched_setaffinity``), and in this one, unpinned.
3. **Ingestion**: ``MemoryService.add_document`` (parse, chunk, embed, store) of a generated
   ~1 MB Markdown text and a generated 50-page PDF (fpdf2), on SQLite; median of 3 runs, each
   into a collection of its own. Parse + chunk and embedding are then timed alone.
4. **Recall in a turn**: ``Runtime.chat`` on SQLite with a zero-latency ``ScriptedModel`` (a
   ~40-word answer streamed a word at a time), one session per agent, ``context_budget`` fixed
   so every agent sends the same history window. CPU is ``time.process_time()`` (all threads;
   the event loop's own share from ``time.thread_time()``) over the measured turns. Agents:
   (a) memory off (``scopes: []``); (b) ``scopes: [session, user]``, ``auto: false``, with 10k
   items in the user namespace of the session's owner, so every turn searches them; (c) the same
   with nothing stored (the common case). The three take turns, 25 turns at a time, so a change
   in the host's load touches all of them alike.

Targets: recall p50 <= 5 ms at 10k and <= 25 ms at 100k items on SQLite; embedding >= 2,000
short texts/s on one core; recall (b) adds <= 10 % to a turn's CPU over (a).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import gc
import json
import math
import os
import platform
import random
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal

import asyncpg  # type: ignore[import-untyped]
import numpy as np
from fpdf import FPDF
from rich.console import Console
from rich.table import Table

from tether.agent import Agent
from tether.memory import documents
from tether.memory.embed import Vectors, default_embedder, to_blob
from tether.memory.search import query_terms
from tether.memory.service import CANDIDATES, MemoryService
from tether.models.base import ModelRequest
from tether.records import (
    LOCAL_PRINCIPAL,
    MEMORY_KINDS,
    MemoryRecord,
    Namespace,
    Principal,
    new_memory_id,
)
from tether.runtime import Runtime
from tether.store import PostgresStore, SQLiteStore, Store
from tether.store.postgres.recall_steps import insert as pg_insert
from tether.testing.scripted import ScriptedModel

StoreKind = Literal["sqlite", "postgres"]
Record = tuple[MemoryRecord, bytes]

PG_ADMIN = "postgresql://postgres@127.0.0.1:5432/postgres"
PG_BASE = "postgresql://postgres@127.0.0.1:5432/"
SIZES_FULL = (1_000, 10_000, 100_000)
SIZES_QUICK = (1_000, 10_000)
TURN_ITEMS = 10_000
PUT_BATCH = 256
PG_PUT_ITEMS = 1_000
PG_BULK_BATCH = 1_000
EMBED_BATCH = 1_024
COLD_RUNS = 3
FRESH_QUERIES = 20
TURN_BLOCK = 25
FIXED_CONTEXT_BUDGET = 800

P50_TARGET_MS = {10_000: 5.0, 100_000: 25.0}
EMBED_TARGET = 2_000.0
TURN_RATIO_TARGET = 1.10

console = Console(highlight=False, width=max(140, Console().width))


# -- the corpus ----------------------------------------------------------------------------------
def _words(text: str) -> tuple[str, ...]:
    return tuple(text.split())


def _phrases(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split("|"))


PEOPLE = _words(
    "sister brother mother father daughter son wife husband partner friend colleague manager "
    "neighbour cousin uncle aunt grandmother grandfather roommate dentist doctor landlord "
    "teacher coach accountant lawyer"
)
NAMES = _words(
    "Maria James Aisha Kenji Olga Pedro Fatima Liam Chen Sofia Noah Priya Lucas Amara Mateo "
    "Yuki Elena Omar Hannah Ravi Zoe Ivan Leila Tomas Grace Arjun Nina Felix Ines Samuel"
)
PLACES = _words(
    "Lisbon Berlin Toronto Osaka Nairobi Lyon Denver Melbourne Krakow Seville Austin Dublin "
    "Bergen Porto Seattle Hanoi Cusco Tallinn Boston Glasgow Munich Chennai Quito Utrecht "
    "Valencia Montreal Auckland Edinburgh Kyoto Marseille"
)
HOBBIES = _phrases(
    "rock climbing | sourdough baking | birdwatching | chess | salsa dancing | trail "
    "running | woodworking | pottery | sailing | knitting | film photography | gardening | "
    "cycling | playing the cello | learning Japanese | swimming | watercolour painting | "
    "brewing beer | fly fishing | board games"
)
FOODS = _phrases(
    "peanuts | shellfish | gluten | lactose | sushi | dark chocolate | spicy ramen | lentil "
    "soup | mango | oat milk | espresso | green tea | blue cheese | falafel | kimchi | "
    "pistachio ice cream | black olives | strawberries"
)
ANIMALS = _words("dog cat parrot rabbit tortoise hamster horse goldfish ferret gecko")
TECH = _words(
    "Python PostgreSQL Rust Kubernetes React Terraform Kafka Redis TypeScript Django Go Spark "
    "Swift Flutter Elixir"
)
DAYS = _words("Monday Tuesday Wednesday Thursday Friday Saturday Sunday")
MONTHS = _words("January March April June August October November December")
WHEN = _phrases(
    "in the morning | after lunch | in the evening | at nine | at noon | before work | late "
    "at night | every other week"
)
EVENTS = _phrases(
    "dentist appointment | team meeting | yoga class | piano lesson | performance review | "
    "flight | job interview | dinner reservation | car service | haircut | book club"
)
THINGS = _phrases(
    "passport | library card | gym membership | frequent flyer | insurance policy | locker"
)
JOBS = _words("nurse engineer designer translator pharmacist architect chef pilot analyst")
REASONS = _phrases(
    "the commute was too long | the rent went up again | a friend recommended it | the "
    "doctor suggested it | it helps with stress | the old one broke last winter"
)
SYLLABLES = _words(
    "ka lo vin tar qua zel mor thi bex dra nu pol shi ven gro lix fa ru sto wen yor cle ham "
    "pri tus dol mex zan bri kor"
)


def pseudo_words(rng: random.Random, n: int) -> list[str]:
    """``n`` distinct made-up words (2-4 syllables): project, pet and product names."""
    seen: dict[str, None] = {}
    while len(seen) < n:
        word = "".join(rng.choice(SYLLABLES) for _ in range(rng.randint(2, 4)))
        seen.setdefault(word.capitalize(), None)
    return list(seen)


@dataclass
class Subject:
    name: str
    poss: str
    has: str
    is_: str
    s: str
    """The verb ending: "enjoys" / "enjoy"."""


THIRD = Subject("The user", "The user's", "has", "is", "s")
FIRST = Subject("I", "My", "have", "am", "")


class Corpus:
    """Seeded memory items and questions about them (see the module docstring)."""

    def __init__(self, seed: int = 7) -> None:
        self.rng = random.Random(seed)
        self.rare = pseudo_words(self.rng, 40_000)
        self.items: list[str] = []
        self.item_rare: list[str | None] = []
        """The rare word of each item (None: none), for questions about the first n items."""

    def grow(self, n: int) -> None:
        while len(self.items) < n:
            text, rare = self._item()
            self.items.append(text)
            self.item_rare.append(rare)

    def _item(self) -> tuple[str, str | None]:
        r = self.rng
        who = THIRD if r.random() < 0.5 else FIRST
        rare = r.choice(self.rare) if r.random() < 0.35 else None
        code = f"{r.choice('KQXZMB')}{r.choice('FRTLW')}{r.randint(10_000, 99_999)}"
        person = f"{r.choice(PEOPLE)} {r.choice(NAMES)}"
        base = r.choice(
            (
                f"{who.poss} {person} moved to {r.choice(PLACES)} in {r.choice(MONTHS)}",
                f"{who.poss} {person} lives near the harbour in {r.choice(PLACES)}",
                f"{who.name} {who.is_} allergic to {r.choice(FOODS)} and avoids {r.choice(FOODS)}",
                f"{who.name} enjoy{who.s} {r.choice(HOBBIES)} {r.choice(WHEN)}",
                f"{who.name} prefer{who.s} {r.choice(FOODS)} over {r.choice(FOODS)} for breakfast",
                f"{who.name} work{who.s} as a {r.choice(JOBS)} at a hospital in {r.choice(PLACES)}",
                f"{who.name} {who.has} a {r.choice(EVENTS)} with {person} on {r.choice(DAYS)} "
                f"{r.choice(WHEN)}",
            )
        )
        if rare is not None:
            base = r.choice(
                (
                    f"{who.name} {who.has} a {r.choice(ANIMALS)} named {rare} who is afraid "
                    "of thunder",
                    f"{who.name} {who.is_} working on a project called {rare} that uses "
                    f"{r.choice(TECH)} and {r.choice(TECH)}",
                    f"{who.poss} favourite restaurant is {rare} in {r.choice(PLACES)}",
                )
            )
        elif r.random() < 0.15:
            rare = code
            base = f"{who.poss} {r.choice(THINGS)} number is {code}"
        words = base.split()
        while len(words) < 10 or (len(words) < 30 and r.random() < 0.55):
            words += self._extra().split()
        return " ".join(words[:40]) + ".", rare

    def _extra(self) -> str:
        r = self.rng
        return r.choice(
            (
                f"because {r.choice(REASONS)}",
                f"since {r.randint(2009, 2025)}",
                f"and wants to try {r.choice(HOBBIES)} with {r.choice(NAMES)} this year",
                f"and plans to visit {r.choice(PLACES)} in {r.choice(MONTHS)}",
                f"according to a conversation on {r.choice(DAYS)}",
                f"which {r.choice(NAMES)} had recommended a while ago",
                f"but said the {r.choice(EVENTS)} on {r.choice(DAYS)} might move",
            )
        )

    def questions(self, n_items: int, count: int) -> list[tuple[str, str]]:
        """``count`` questions ``(kind, text)`` about the first ``n_items`` items."""
        r = random.Random(n_items * 31 + count)
        rares = [w for w in self.item_rare[:n_items] if w is not None]
        out: list[tuple[str, str]] = []
        for i in range(count):
            roll = i % 10
            if roll < 4 and rares:
                out.append(("rare", self._rare_question(r, r.choice(rares))))
            elif roll < 7:
                out.append(("paraphrase", self._paraphrase(r)))
            else:
                out.append(("chatty", self._chatty(r)))
        return out

    @staticmethod
    def _rare_question(r: random.Random, word: str) -> str:
        return r.choice(
            (
                f"What do you remember about {word}?",
                f"Is {word} still using the same stack?",
                f"Remind me, what was {word} again?",
                f"What's the number on my {word}? I need it for a form",
                f"how is {word} doing",
            )
        )

    @staticmethod
    def _paraphrase(r: random.Random) -> str:
        return r.choice(
            (
                f"Which town did my sibling relocate to? I think it was {r.choice(MONTHS)}",
                "What foods make me ill?",
                "What pastimes am I into lately?",
                "What's my pet called?",
                f"When is my next visit to the clinic, {r.choice(DAYS)}?",
                f"Where is {r.choice(NAMES)} employed these days?",
                "Which programming languages does my side project rely on?",
                "What do I like to eat first thing in the day?",
                f"Who do I know that resides in {r.choice(PLACES)}?",
                "Any plans to travel abroad soon?",
            )
        )

    @staticmethod
    def _chatty(r: random.Random) -> str:
        return r.choice(
            (
                "what did I tell you about that last time?",
                f"do you remember what I said about my {r.choice(PEOPLE)}?",
                f"is there anything I should know before {r.choice(DAYS)}?",
                "can you remind me what I was doing then?",
                "what was the name of it again?",
                f"and what about the one in {r.choice(PLACES)}?",
                f"have I ever mentioned {r.choice(HOBBIES)} to you?",
                "ok thanks, and what else do you know about me?",
            )
        )

    def short_texts(self, n: int) -> list[str]:
        """``n`` texts of 5-15 words (the embedding benchmark's input)."""
        r = random.Random(n)
        self.grow(2_000)
        out = []
        for _ in range(n):
            words = r.choice(self.items[:2_000]).rstrip(".").split()
            k = r.randint(5, 15)
            start = r.randint(0, max(0, len(words) - k))
            out.append(" ".join(words[start : start + k]))
        return out


def embed_all(texts: Sequence[str]) -> Vectors:
    emb = default_embedder()
    parts = [emb.embed_sync(texts[s : s + EMBED_BATCH]) for s in range(0, len(texts), EMBED_BATCH)]
    return np.concatenate(parts) if parts else np.zeros((0, 256), np.float32)


def records(texts: Sequence[str], vectors: Vectors, ns: Namespace) -> list[Record]:
    now = time.time()
    out = []
    for i, text in enumerate(texts):
        record = MemoryRecord(
            id=new_memory_id(),
            namespace=ns,
            kind=MEMORY_KINDS[i % len(MEMORY_KINDS)],
            content=text,
            meta={"author": ns.owner},
            created_at=now,
            updated_at=now,
        )
        out.append((record, to_blob(vectors[i])))
    return out


# -- stats ---------------------------------------------------------------------------------------
def pct(values: Sequence[float], q: float) -> float:
    if not values:
        return math.nan
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, math.ceil(q * len(ordered)) - 1))]


def ms(values: Sequence[float], q: float) -> str:
    return f"{1000 * pct(values, q):.2f}"


def verdict(ok: bool) -> str:
    return "[green]met[/]" if ok else "[red]not met[/]"


# -- PostgreSQL ----------------------------------------------------------------------------------
async def pg_exec(sql: str) -> None:
    conn = await asyncpg.connect(PG_ADMIN)
    try:
        await conn.execute(sql)
    finally:
        await conn.close()


# -- 1. recall -----------------------------------------------------------------------------------
@dataclass
class Recall:
    store: StoreKind
    items: int
    cold: list[float] = field(default_factory=list)
    after_write: list[float] = field(default_factory=list)
    """A warm service's first search after one new item: the matrix is loaded again."""
    load: float = 0.0
    """``store.load_vectors`` alone (the I/O part of a cold search)."""
    full: list[float] = field(default_factory=list)
    lexical: list[float] = field(default_factory=list)
    embed: list[float] = field(default_factory=list)
    vector: list[float] = field(default_factory=list)
    by_seq: list[float] = field(default_factory=list)
    """``store.memory_by_seq`` of the search's hits: fetching the records it returns."""
    kinds: list[str] = field(default_factory=list)
    candidates: list[int] = field(default_factory=list)
    """Lexical candidates found per query (at most CANDIDATES)."""
    matrix_mb: float = 0.0

    def by_kind(self, kind: str) -> list[float]:
        return [t for t, k in zip(self.full, self.kinds, strict=True) if k == kind]


async def fill(store: Store, rows: Sequence[Record], put: int) -> float:
    """Insert ``rows``, the first ``put`` with ``put_memory`` (PUT_BATCH at a time, gathered),
    the rest too on SQLite and in bulk on PostgreSQL. Returns put_memory's records/s."""
    if not isinstance(store, PostgresStore):
        put = len(rows)
    start = time.perf_counter()
    for s in range(0, put, PUT_BATCH):
        await asyncio.gather(
            *(store.put_memory(r, e) for r, e in rows[s : min(put, s + PUT_BATCH)])
        )
    rate = put / (time.perf_counter() - start) if put else math.nan
    if isinstance(store, PostgresStore):
        for s in range(put, len(rows), PG_BULK_BATCH):
            async with store._tx() as conn:
                await pg_insert(conn, rows[s : s + PG_BULK_BATCH])
    return rate


async def lexical_times(store: Store, ns: Namespace, questions: list[tuple[str, str]]) -> float:
    """p50 seconds of ``lexical_search`` alone over ``questions``."""
    times = []
    for _, text in questions:
        start = time.perf_counter()
        await store.lexical_search([ns], collection="", terms=query_terms(text), limit=CANDIDATES)
        times.append(time.perf_counter() - start)
    return pct(times, 0.5)


async def cold_searches(
    store: Store, ns: Namespace, questions: list[tuple[str, str]]
) -> tuple[MemoryService, list[float]]:
    """First searches of fresh services (each loads the matrix); returns the last service."""
    service = MemoryService(store, embedder=default_embedder())
    times = []
    for i in range(COLD_RUNS):
        service = MemoryService(store, embedder=default_embedder())
        gc.collect()
        start = time.perf_counter()
        await service.search([ns], questions[i][1], limit=5)
        times.append(time.perf_counter() - start)
    return service, times


async def searches_after_write(
    service: MemoryService, store: Store, ns: Namespace, questions: list[tuple[str, str]]
) -> list[float]:
    """A search right after one item was added to the namespace (as ``remember`` or an
    automatic note does): the version moved, so the cached matrix is stale. The item is deleted
    again afterwards, so the namespace keeps its size."""
    times = []
    for i in range(COLD_RUNS):
        text = f"My new locker code is {1000 + i}, the old one stopped working."
        row = records([text], default_embedder().embed_sync([text]), ns)[0]
        record = await store.put_memory(*row)
        start = time.perf_counter()
        await service.search([ns], questions[i][1], limit=5)
        times.append(time.perf_counter() - start)
        await store.delete_memory(ns, record.id)
    return times


async def measure_recall(
    store: Store, kind: StoreKind, ns: Namespace, questions: list[tuple[str, str]], n: int
) -> Recall:
    out = Recall(kind, n)
    emb = default_embedder()
    service, out.cold = await cold_searches(store, ns, questions)
    start = time.perf_counter()
    await store.load_vectors(ns, collection="")
    out.load = time.perf_counter() - start
    out.matrix_mb = sum(m.nbytes for m in service.index._cache.values()) / 1e6
    gc.collect()
    for qkind, text in questions:
        start = time.perf_counter()
        hits = await service.search([ns], text, limit=5)
        out.full.append(time.perf_counter() - start)
        out.kinds.append(qkind)
        start = time.perf_counter()
        await store.memory_by_seq([ns], [h.record.seq for h in hits])
        out.by_seq.append(time.perf_counter() - start)
        start = time.perf_counter()
        lexical = await store.lexical_search(
            [ns], collection="", terms=query_terms(text), limit=CANDIDATES
        )
        out.lexical.append(time.perf_counter() - start)
        out.candidates.append(len(lexical))
        start = time.perf_counter()
        vector = (await emb.embed([text]))[0]
        out.embed.append(time.perf_counter() - start)
        version = await store.vector_version(ns, collection="")
        start = time.perf_counter()
        await service.index.nearest(store, [(ns, version)], "", vector, CANDIDATES)
        out.vector.append(time.perf_counter() - start)
    out.after_write = await searches_after_write(service, store, ns, questions)
    return out


@dataclass
class Grown:
    """What growing one store showed besides the searches."""

    put_rate: float = math.nan
    fresh_lexical: float = math.nan
    """PostgreSQL: lexical p50 right after the first bulk insert, before any ANALYZE."""
    analyzed_lexical: float = math.nan
    """PostgreSQL: the same questions right after VACUUM ANALYZE."""
    fills: list[tuple[int, float]] = field(default_factory=list)


async def recall_on(
    kind: StoreKind, store: Store, corpus: Corpus, vectors: Vectors, sizes: Sequence[int], q: int
) -> tuple[list[Recall], Grown]:
    ns = Namespace.user(LOCAL_PRINCIPAL.tenant, LOCAL_PRINCIPAL.user)
    results: list[Recall] = []
    grown = Grown()
    await store.open()
    try:
        have = 0
        for n in sizes:
            rows = records(corpus.items[have:n], vectors[have:n], ns)
            started = time.perf_counter()
            rate = await fill(store, rows, PG_PUT_ITEMS if have == 0 else 0)
            grown.fills.append((n - have, time.perf_counter() - started))
            questions = corpus.questions(n, q)
            if have == 0:
                grown.put_rate = rate
            if isinstance(store, PostgresStore):
                if have == 0:
                    grown.fresh_lexical = await lexical_times(store, ns, questions[:FRESH_QUERIES])
                # What autovacuum does on a live database: planner statistics, and the GIN
                # index's pending list merged (a search scans that list linearly).
                async with store._conn() as conn:
                    await conn.execute("VACUUM ANALYZE memory")
                if have == 0:
                    grown.analyzed_lexical = await lexical_times(
                        store, ns, questions[:FRESH_QUERIES]
                    )
            console.print(
                f"  {kind}: {n:,} items ({n - have:,} inserted in "
                f"{time.perf_counter() - started:.1f} s); searching…",
                style="dim",
            )
            have = n
            results.append(await measure_recall(store, kind, ns, questions, n))
    finally:
        await store.close()
    return results, grown


def recall_table(results: list[Recall]) -> Table:
    table = Table(title="Recall: MemoryService.search(limit=5), one user namespace, warm")
    cols = ("store", "items", "queries", "p50 ms", "p99 ms", "mean ms")
    for col in cols:
        table.add_column(col, justify="left" if col == "store" else "right")
    table.add_column("p50 ms: rare | paraphrase | chatty", justify="right")
    table.add_column("target (SQLite p50)", justify="right")
    for r in results:
        target = P50_TARGET_MS.get(r.items)
        p50 = 1000 * pct(r.full, 0.5)
        shown = ""
        if target is not None and r.store == "sqlite":
            shown = f"<= {target:.0f} ms {verdict(p50 <= target)}"
        table.add_row(
            r.store,
            f"{r.items:,}",
            str(len(r.full)),
            f"{p50:.2f}",
            ms(r.full, 0.99),
            f"{1000 * statistics.fmean(r.full):.2f}",
            " | ".join(ms(r.by_kind(k), 0.5) for k in ("rare", "paraphrase", "chatty")),
            shown,
        )
    return table


def parts_table(results: list[Recall]) -> Table:
    table = Table(title="Recall by part, warm, ms (each timed alone, right after the full search)")
    cols = (
        "store",
        "items",
        "lexical p50 | p99",
        "lexical hits",
        "embed p50",
        "vector p50 | p99",
        "by seq p50 | p99",
    )
    for col in cols:
        table.add_column(col, justify="left" if col == "store" else "right")
    for r in results:
        table.add_row(
            r.store,
            f"{r.items:,}",
            f"{ms(r.lexical, 0.5)} | {ms(r.lexical, 0.99)}",
            f"{statistics.fmean(r.candidates):.0f}",
            ms(r.embed, 0.5),
            f"{ms(r.vector, 0.5)} | {ms(r.vector, 0.99)}",
            f"{ms(r.by_seq, 0.5)} | {ms(r.by_seq, 0.99)}",
        )
    return table


def load_table(results: list[Recall]) -> Table:
    table = Table(title="Recall with the matrix (re)loaded, ms")
    cols = (
        "store",
        "items",
        "matrix MB",
        "load_vectors alone",
        "1st search, fresh service",
        "1st search after a write",
    )
    for col in cols:
        table.add_column(col, justify="left" if col == "store" else "right")
    for r in results:
        table.add_row(
            r.store,
            f"{r.items:,}",
            f"{r.matrix_mb:.0f}",
            f"{1000 * r.load:.0f}",
            f"{1000 * statistics.median(r.cold):.0f}",
            f"{1000 * statistics.median(r.after_write):.0f}",
        )
    return table


# -- 2. embedding --------------------------------------------------------------------------------
BATCHES = (1, 32, 256)


def embed_rates(seconds: float) -> dict[int, tuple[float, float]]:
    """Per batch size: (texts/s wall, CPU seconds per text) over about ``seconds``."""
    emb = default_embedder()
    texts = Corpus().short_texts(4_096)
    emb.embed_sync(texts[:256])  # load the model, warm the tokenizer
    out: dict[int, tuple[float, float]] = {}
    for batch in BATCHES:
        done, cpu0, start = 0, time.process_time(), time.perf_counter()
        while time.perf_counter() - start < seconds:
            for s in range(0, 1_024, batch):
                emb.embed_sync(texts[(done + s) % 3_072 : (done + s) % 3_072 + batch])
            done += 1_024
        wall, cpu = time.perf_counter() - start, time.process_time() - cpu0
        out[batch] = (done / wall, cpu / done)
    return out


_PINNED_CHILD = """
import os, sys
os.sched_setaffinity(0, {0})  # first: every thread started later (BLAS, tokenizer) inherits it
sys.path.insert(0, sys.argv[1])
import json, memory
print(json.dumps(memory.embed_rates(float(sys.argv[2]))))
"""


def embed_pinned(seconds: float) -> dict[int, tuple[float, float]] | None:
    """:func:`embed_rates` in a child process pinned to core 0 (None if that failed)."""
    bench = str(Path(__file__).resolve().parent)
    proc = subprocess.run(
        [sys.executable, "-c", _PINNED_CHILD, bench, str(seconds)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    if proc.returncode != 0:
        console.print(f"[red]pinned embedding run failed:[/] {proc.stderr[-2000:]}")
        return None
    data = json.loads(proc.stdout.strip().splitlines()[-1])
    return {int(k): (float(v[0]), float(v[1])) for k, v in data.items()}


def embed_table(
    pinned: dict[int, tuple[float, float]] | None, free: dict[int, tuple[float, float]]
) -> Table:
    table = Table(title="Embedding: WordLlamaEmbedder.embed_sync, texts of 5-15 words")
    cols = ("batch", "texts/s, 1 core", "µs/text", "texts/s, unpinned", "CPU µs/text, unpinned", "")
    for col in cols:
        table.add_column(col, justify="right")
    for batch in BATCHES:
        one = pinned.get(batch) if pinned else None
        table.add_row(
            str(batch),
            f"{one[0]:,.0f}" if one else "?",
            f"{1e6 / one[0]:.0f}" if one else "?",
            f"{free[batch][0]:,.0f}",
            f"{1e6 * free[batch][1]:.0f}",
            f">= {EMBED_TARGET:,.0f} {verdict(one[0] >= EMBED_TARGET)}" if one else "",
        )
    return table


# -- 3. ingestion --------------------------------------------------------------------------------
def markdown_doc(corpus: Corpus, size: int) -> bytes:
    corpus.grow(20_000)
    r = random.Random(size)
    parts: list[str] = []
    length, section = 0, 0
    while length < size:
        section += 1
        heading = f"## {section}. {r.choice(HOBBIES).capitalize()} in {r.choice(PLACES)}\n\n"
        paras = [
            " ".join(r.choice(corpus.items) for _ in range(r.randint(3, 7)))
            for _ in range(r.randint(2, 5))
        ]
        if r.random() < 0.3:
            paras.append("\n".join(f"- {r.choice(corpus.items)}" for _ in range(4)))
        text = heading + "\n\n".join(paras) + "\n\n"
        parts.append(text)
        length += len(text)
    return ("# Field notes\n\n" + "".join(parts)).encode()


def pdf_doc(corpus: Corpus, pages: int) -> bytes:
    corpus.grow(20_000)
    r = random.Random(pages)
    pdf = FPDF(format="A4")
    pdf.set_auto_page_break(auto=False)
    pdf.set_font("helvetica", size=10)
    for page in range(pages):
        pdf.add_page()
        pdf.set_font("helvetica", style="B", size=14)
        pdf.cell(0, 10, f"Chapter {page + 1}: {r.choice(PLACES)}", new_x="LMARGIN", new_y="NEXT")
        pdf.set_font("helvetica", size=10)
        text = " ".join(r.choice(corpus.items) for _ in range(22))
        pdf.multi_cell(0, 5, text, new_x="LMARGIN", new_y="NEXT")
    return bytes(pdf.output())


@dataclass
class Ingest:
    name: str
    size: int
    pages: int
    chunks: int
    total: list[float]
    parse: float
    embed: float


async def ingest(name: str, data: bytes, media_type: str, runs: int, root: Path) -> Ingest:
    store = SQLiteStore(root / f"ingest-{name}.db")
    await store.open()
    try:
        service = MemoryService(store, embedder=default_embedder())
        totals: list[float] = []
        chunks = 0
        for i in range(runs):
            gc.collect()
            start = time.perf_counter()
            doc = await service.add_document(
                LOCAL_PRINCIPAL, f"docs{i}", data, name=name, media_type=media_type
            )
            totals.append(time.perf_counter() - start)
            chunks = doc.chunks
    finally:
        await store.close()
    start = time.perf_counter()
    parsed = documents.parse_document(name, data, media_type)
    pieces = documents.chunk_document(parsed)
    parse = time.perf_counter() - start
    start = time.perf_counter()
    texts = [c.text for c in pieces]
    for s in range(0, len(texts), 256):
        default_embedder().embed_sync(texts[s : s + 256])
    return Ingest(
        name, len(data), len(parsed.pages), chunks, totals, parse, time.perf_counter() - start
    )


def ingest_table(results: list[Ingest]) -> Table:
    table = Table(title="Knowledge ingestion: MemoryService.add_document on SQLite")
    cols = (
        "document",
        "MB",
        "pages",
        "chunks",
        "total s",
        "chunks/s",
        "MB/s",
        "parse+chunk s",
        "embed s",
        "store + rest s",
    )
    for col in cols:
        table.add_column(col, justify="left" if col == "document" else "right")
    for r in results:
        total = statistics.median(r.total)
        table.add_row(
            r.name,
            f"{r.size / 1e6:.2f}",
            str(r.pages),
            f"{r.chunks:,}",
            f"{total:.2f}",
            f"{r.chunks / total:,.0f}",
            f"{r.size / 1e6 / total:.2f}",
            f"{r.parse:.2f}",
            f"{r.embed:.2f}",
            f"{max(0.0, total - r.parse - r.embed):.2f}",
        )
    return table


# -- 4. recall in a turn -------------------------------------------------------------------------
ANSWER = (
    "Sure: from what you told me earlier, the appointment is on Thursday after lunch, and your "
    "sister said the restaurant in Lisbon is worth the trip; I would book it for the evening and "
    "bring the passport number with you."
)


@dataclass
class TurnConfig:
    label: str
    agent: Agent
    principal: Principal
    items: int
    cpu: float = 0.0
    loop_cpu: float = 0.0
    """CPU of the event-loop thread alone; the rest is the SQLite thread's and any other's."""
    latencies: list[float] = field(default_factory=list)
    recalled: int = 0

    @property
    def cpu_ms(self) -> float:
        return 1000 * self.cpu / max(1, len(self.latencies))

    @property
    def loop_cpu_ms(self) -> float:
        return 1000 * self.loop_cpu / max(1, len(self.latencies))


def turn_agent(name: str, memory: dict[str, object], seen: list[str]) -> Agent:
    def answer(request: ModelRequest) -> str:
        if "<memory>" in request.messages[0].content:
            seen.append(name)
        return ANSWER

    model = ScriptedModel(default=answer)
    return Agent(name=name, model=model, memory=memory, context_budget=FIXED_CONTEXT_BUDGET)


async def turn_share(corpus: Corpus, vectors: Vectors, turns: int, root: Path) -> list[TurnConfig]:
    seen: list[str] = []
    empty = Principal(tenant=LOCAL_PRINCIPAL.tenant, user="nobody", roles=frozenset())
    on = {"scopes": ["session", "user"], "auto": False}
    configs = [
        TurnConfig(
            "(a) memory off",
            turn_agent("off", {"scopes": [], "auto": False}, seen),
            LOCAL_PRINCIPAL,
            0,
        ),
        TurnConfig(
            f"(b) recall over {TURN_ITEMS // 1000}k items",
            turn_agent("full", on, seen),
            LOCAL_PRINCIPAL,
            TURN_ITEMS,
        ),
        TurnConfig("(c) recall, empty namespace", turn_agent("empty", on, seen), empty, 0),
    ]
    store = SQLiteStore(root / "turns.db")
    async with Runtime(store, agents=[c.agent for c in configs], data_dir=root) as rt:
        ns = Namespace.user(LOCAL_PRINCIPAL.tenant, LOCAL_PRINCIPAL.user)
        await fill(store, records(corpus.items[:TURN_ITEMS], vectors[:TURN_ITEMS], ns), 0)
        questions = [t for _, t in corpus.questions(TURN_ITEMS, 400)]
        for c in configs:  # warm-up: sessions created, the 10k matrix loaded
            for n in range(3):
                await rt.chat(
                    c.agent, questions[n], session_id=f"s-{c.agent.name}", principal=c.principal
                )
        seen.clear()
        for block in range(0, turns, TURN_BLOCK):
            for c in configs:
                gc.collect()
                cpu0, loop0 = time.process_time(), time.thread_time()
                for n in range(block, min(turns, block + TURN_BLOCK)):
                    start = time.perf_counter()
                    await rt.chat(
                        c.agent,
                        questions[n % len(questions)],
                        session_id=f"s-{c.agent.name}",
                        principal=c.principal,
                    )
                    c.latencies.append(time.perf_counter() - start)
                c.cpu += time.process_time() - cpu0
                c.loop_cpu += time.thread_time() - loop0
                model = c.agent.model
                assert isinstance(model, ScriptedModel)
                model.requests.clear()
    for c in configs:
        c.recalled = seen.count(c.agent.name)
    return configs


def turn_table(configs: list[TurnConfig]) -> Table:
    table = Table(title="Recall's share of a turn: Runtime.chat, SQLite, 0-latency scripted model")
    cols = (
        "agent",
        "items",
        "turns",
        "turns recalled",
        "CPU ms/turn",
        "loop | other threads",
        "vs (a)",
        "p50 ms",
        "p99 ms",
    )
    for col in cols:
        table.add_column(col, justify="left" if col == "agent" else "right")
    base = configs[0].cpu_ms
    for c in configs:
        table.add_row(
            c.label,
            f"{c.items:,}",
            str(len(c.latencies)),
            str(c.recalled),
            f"{c.cpu_ms:.2f}",
            f"{c.loop_cpu_ms:.2f} | {c.cpu_ms - c.loop_cpu_ms:.2f}",
            f"{c.cpu_ms / base:.2f}x",
            ms(c.latencies, 0.5),
            ms(c.latencies, 0.99),
        )
    return table


# -- main ----------------------------------------------------------------------------------------
def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0] if __doc__ else None)
    parser.add_argument("--quick", action="store_true", help="1k and 10k items, fewer queries")
    parser.add_argument("--no-postgres", action="store_true", help="recall on SQLite only")
    args = parser.parse_args()
    quick: bool = args.quick
    sizes = SIZES_QUICK if quick else SIZES_FULL
    queries = 100 if quick else 300
    turns = 100 if quick else 300
    kinds: list[StoreKind] = ["sqlite"] if args.no_postgres else ["sqlite", "postgres"]

    command = " ".join([".venv/bin/python", "bench/memory.py", *sys.argv[1:]])
    console.print(f"[bold]Command:[/] {command}")
    console.print(
        f"Python {platform.python_version()}, numpy {np.__version__}, SQLite "
        f"{sqlite3.sqlite_version}, {platform.machine()}, {os.cpu_count()} CPUs; load average "
        f"{_load()} before the run (latencies and CPU times inflate when other processes share "
        f"the cores); OPENBLAS_NUM_THREADS={os.environ.get('OPENBLAS_NUM_THREADS', 'unset')}"
    )
    started = time.perf_counter()
    corpus = Corpus()
    corpus.grow(max(sizes))
    t0 = time.perf_counter()
    vectors = embed_all(corpus.items)
    console.print(
        f"  {len(corpus.items):,} items generated and embedded "
        f"({len(corpus.items) / (time.perf_counter() - t0):,.0f} items/s)",
        style="dim",
    )

    with tempfile.TemporaryDirectory(prefix="tether-bench-mem-") as tmp:
        root = Path(tmp)
        recalls = run_recall(kinds, corpus, vectors, sizes, queries, root)

        seconds = 0.5 if quick else 1.5
        pinned = embed_pinned(seconds)
        free = embed_rates(seconds)
        console.print(embed_table(pinned, free))

        runs = 1 if quick else 3
        md, pdf = markdown_doc(corpus, 1_000_000), pdf_doc(corpus, 50)
        ingests = [
            asyncio.run(ingest("notes.md", md, "text/markdown", runs, root)),
            asyncio.run(ingest("report.pdf", pdf, "application/pdf", runs, root)),
        ]
        console.print(ingest_table(ingests))
        console.print(
            f"Median of {runs} end-to-end runs; parse+chunk and embed (batches of 256, on this "
            "thread) timed alone afterwards; 'store + rest' = total - both (the SQLite "
            "transaction, thread hand-offs, building records)."
        )

        configs = asyncio.run(turn_share(corpus, vectors, turns, root))
        console.print(turn_table(configs))
        console.print(
            f"Turns interleaved in blocks of {TURN_BLOCK} (a, b, c, a, …), 3 warm-up turns each "
            f"not counted; context_budget={FIXED_CONTEXT_BUDGET} for all; 'turns recalled': turns "
            "whose prompt had a <memory> block."
        )
    summary(recalls, pinned, configs)
    console.print(f"\nTotal {time.perf_counter() - started:.0f} s; load average {_load()}")


def run_recall(
    kinds: Sequence[StoreKind],
    corpus: Corpus,
    vectors: Vectors,
    sizes: Sequence[int],
    queries: int,
    root: Path,
) -> list[Recall]:
    recalls: list[Recall] = []
    grown: dict[StoreKind, Grown] = {}
    for kind in kinds:
        if kind == "sqlite":
            store = SQLiteStore(root / "recall.db")
            got, grown[kind] = asyncio.run(recall_on(kind, store, corpus, vectors, sizes, queries))
        else:
            got, grown[kind] = asyncio.run(recall_postgres(corpus, vectors, sizes, queries))
        recalls += got
    console.print(recall_table(recalls))
    console.print(
        "The whole search, warm (matrix cached), one query at a time; 'rare | paraphrase | "
        "chatty': p50 of each kind of question (4 : 3 : 3)."
    )
    console.print(parts_table(recalls))
    console.print(
        f"lexical: store.lexical_search ({CANDIDATES} candidates; hits: mean found); embed: the "
        "query's embedding; vector: index.nearest over the cached matrix; by seq: "
        "store.memory_by_seq of the (<= 5) hits, the records the search returns."
    )
    console.print(load_table(recalls))
    console.print(
        "fresh service: the first search of a new MemoryService (empty matrix cache); after a "
        "write: a warm service's next search after one put_memory to the namespace (the version "
        f"moved, so the whole matrix is loaded again); both median of {COLD_RUNS}."
    )
    for kind, g in grown.items():
        fills = ", ".join(f"{n:,} in {t:.1f} s" for n, t in g.fills)
        console.print(f"{kind}: inserted {fills}; put_memory {g.put_rate:,.0f} records/s")
    pg = grown.get("postgres")
    if pg is not None:
        console.print(
            f"postgres, {sizes[0]:,} items, right after the insert (no ANALYZE yet): lexical p50 "
            f"{1000 * pg.fresh_lexical:.1f} ms; after VACUUM ANALYZE "
            f"{1000 * pg.analyzed_lexical:.1f} ms ({FRESH_QUERIES} questions). Every row above is "
            "after VACUUM ANALYZE."
        )
    return recalls


async def recall_postgres(
    corpus: Corpus, vectors: Vectors, sizes: Sequence[int], queries: int
) -> tuple[list[Recall], Grown]:
    name = f"tether_bench_mem_{os.getpid()}"
    await pg_exec(f'CREATE DATABASE "{name}"')
    try:
        return await recall_on(
            "postgres", PostgresStore(PG_BASE + name), corpus, vectors, sizes, queries
        )
    finally:
        with contextlib.suppress(Exception):
            await pg_exec(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def summary(
    recalls: list[Recall],
    pinned: dict[int, tuple[float, float]] | None,
    configs: list[TurnConfig],
) -> None:
    console.print("\n[bold]Targets[/]")
    for r in recalls:
        target = P50_TARGET_MS.get(r.items)
        if r.store == "sqlite" and target is not None:
            p50 = 1000 * pct(r.full, 0.5)
            console.print(
                f"  recall p50, SQLite, {r.items:,} items: {p50:.2f} ms (target <= {target:.0f} "
                f"ms) {verdict(p50 <= target)}"
            )
    if pinned:
        best = max(rate for rate, _ in pinned.values())
        console.print(
            f"  embedding, one core: {pinned[1][0]:,.0f} / {pinned[32][0]:,.0f} / "
            f"{pinned[256][0]:,.0f} texts/s at batch 1 / 32 / 256 (target >= "
            f"{EMBED_TARGET:,.0f}) {verdict(min(r for r, _ in pinned.values()) >= EMBED_TARGET)}"
            f"; best {best:,.0f}"
        )
    a, b, c = configs
    ratio = b.cpu_ms / a.cpu_ms
    console.print(
        f"  recall over {TURN_ITEMS:,} items, CPU per turn (b)/(a): {ratio:.2f}x, "
        f"+{b.cpu_ms - a.cpu_ms:.2f} ms (target <= {TURN_RATIO_TARGET:.2f}x) "
        f"{verdict(ratio <= TURN_RATIO_TARGET)}; empty namespace (c)/(a): "
        f"{c.cpu_ms / a.cpu_ms:.2f}x"
    )


def _load() -> str:
    try:
        return f"{os.getloadavg()[0]:.2f}"
    except OSError:
        return "?"


if __name__ == "__main__":
    main()
