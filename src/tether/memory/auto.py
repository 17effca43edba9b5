"""Automatic notes: the user's own statements about themselves, kept as memory.

A small model answers "What's my name?" from a fact in its system prompt far more reliably than
from chat history (measured: 5 of 6 against about 1 of 6), so with automatic notes on, a turn's
input is scanned for first-person statements ("My name is Alice", "I live in Lyon") and each is
stored as a note, rewritten in the third person where a simple rule allows ("The user's name is
Alice."). Questions and requests are not statements and are left alone.

What is never kept is decided in :mod:`tether.memory.refusals` (README "What automatic notes
keep" says the same in plain words): secrets, named or by shape (a message holding one keeps no
note at all); special-category and precise contact data (the sentence holding it is dropped);
and anything in a message longer than ``MAX_MESSAGE_CHARS``.
"""

from __future__ import annotations

import re
from collections.abc import Iterator

from tether.memory.refusals import has_secret, is_sensitive

MAX_NOTE_CHARS = 300
MAX_NOTES_PER_TURN = 5
# A longer message is a document pasted in, not a few words about oneself; reading it would
# also hold the event loop (up to about 5 ms per 1,000 characters, a few sentences take 0.1 ms).
MAX_MESSAGE_CHARS = 4_000

# "i" in "i.e." is no pronoun.
_FIRST_PERSON = re.compile(
    r"\b(i|i'm|i’m|im|my|mine|me|i've|i’ve|i'd|i’d|i'll|i’ll)\b(?!\.\w)", re.I
)
# Openings of requests and questions without a question mark: not facts about the user.
_REQUEST = re.compile(
    r"^\s*(please|can|could|would|will|do|does|did|is|are|what|who|where|when|why|how|which|"
    r"tell|show|give|help|let|write|explain|list|make|find|remind)\b",
    re.I,
)
_REWRITES: list[tuple[re.Pattern[str], str]] = [
    (re.compile(r"\bi\s+am\b|\bi['’]m\b", re.I), "the user is"),
    (re.compile(r"\bi\s+have\b|\bi['’]ve\b", re.I), "the user has"),
    (re.compile(r"\bi\s+was\b", re.I), "the user was"),
    (re.compile(r"\bmy\b", re.I), "the user's"),
    (re.compile(r"\bmine\b", re.I), "the user's"),
]
_SIMPLE = re.compile(r"^\s*(the user('s)?\b)", re.I)
_GREETING = re.compile(r"^(hi|hello|hey|hiya|good (morning|afternoon|evening))\b[,!.\s]*", re.I)
_ATTRIBUTE = re.compile(r"^(The user's [\w' -]{1,40}? is) ", re.I)

# --- Sentences -----------------------------------------------------------------------------

# A sentence ends at . ! ? (with any closing quote or bracket) before a space or the end, at a
# line end, and at a full stop glued to the next sentence ("cats.My"). Dots inside decimals,
# versions, emails and URLs are not followed by a space, so they never end one.
_END = re.compile(r"[.!?…]+[\"'”’)\]]*(?=\s|$)|\n|(?<=[a-z]{2})\.(?=[A-Z][a-z])")
# Titles stand before a name: never the end of a sentence ("Dr. Smith").
_TITLES = frozenset(
    ("dr", "mr", "mrs", "ms", "mx", "prof", "st", "mt", "rev", "fr", "sgt", "capt", "col", "gen",
     "lt", "hon", "gov", "sen", "rep", "pres", "mme", "mlle")
)  # fmt: skip
# Abbreviations only ever seen inside a sentence.
_INNER = frozenset(("e.g", "i.e", "vs", "cf", "viz"))
# Abbreviations that may also close one: they end it only before a capital ("... pears etc. My").
_ABBREVIATIONS = frozenset(
    ("etc", "jr", "sr", "inc", "ltd", "co", "corp", "approx", "ca", "incl", "dept", "est", "fig",
     "no", "nos", "vol", "al", "ph.d", "a.m", "p.m")
)  # fmt: skip
_DOTTED = re.compile(r"^(?:[a-z]\.)+[a-z]$")  # U.S, a.m
# Spans a sentence end is never looked for in: emails and URLs keep their dots. (The lookbehind
# makes a failed match cost one pass over a long word, not one per character of it.)
_EMAIL = re.compile(r"(?<![\w.+-])[\w.+-]+@[\w-]+(?:\.[\w-]+)+")
_URL = re.compile(r"\b(?:https?://|www\.)[^\s]*[^\s.,!?;:)\]\"'”’]", re.I)
_WORD_BEFORE = re.compile(r"(\S{1,12})$")
_WORD_AFTER = re.compile(r"\s*([^\s,;:]*)")


def _is_end(text: str, m: re.Match[str]) -> bool:
    """Whether the full stop at ``m`` ends a sentence, from the word it closes. Only a few
    characters either side are read, so splitting stays linear in the message."""
    before = _WORD_BEFORE.search(text, max(0, m.start() - 12), m.start())
    if m.group() != "." or before is None:
        return True
    word = before.group(1).lstrip("(\"'“‘")
    if len(word) == 1 and word.isalpha() and word.isupper() and word != "I":
        return False  # an initial: "J. R. R. Tolkien" (but "... so am I. My ...")
    low = word.lower()
    after = _WORD_AFTER.match(text, m.end())
    following = after.group(1) if after else ""
    if low in _TITLES:
        # ... unless "I" or "my" follows: no one is called that ("I live on Main St. My ...").
        return _FIRST_PERSON.fullmatch(following) is not None
    if low in _INNER:
        return False
    if low in _ABBREVIATIONS or _DOTTED.match(low):
        return following[:1].isupper()
    return True


def _sentences(text: str) -> Iterator[str]:
    masked = text
    for pattern in (_EMAIL, _URL):
        masked = pattern.sub(lambda m: "_" * len(m.group()), masked)
    start = 0
    for m in _END.finditer(masked):
        if _is_end(masked, m):
            yield text[start : m.end()]
            start = m.end()
    yield text[start:]


# --- Notes ---------------------------------------------------------------------------------------


def _rewrite(sentence: str) -> str:
    """Third person for the plain patterns; anything else is quoted as the user's words."""
    text = sentence.strip().rstrip(".!")
    rewritten = text
    for pattern, repl in _REWRITES:
        rewritten = pattern.sub(repl, rewritten)
    leftover = re.search(r"\b(i|me|i['’]d|i['’]ll)\b(?!\.\w)", rewritten, re.I)
    if leftover is None and _SIMPLE.match(rewritten):
        return rewritten[0].upper() + rewritten[1:] + "."
    return f'The user said: "{text}".'


def _statement(sentence: str) -> str | None:
    """The note one sentence gives, if it is a first-person statement worth keeping."""
    sentence = sentence.strip()
    if not sentence or sentence.rstrip("\"'”’)]").endswith("?") or len(sentence) > MAX_NOTE_CHARS:
        return None
    if _REQUEST.match(sentence) or not _FIRST_PERSON.search(sentence):
        return None
    # Strip a greeting in front ("Hi, my name is Alice").
    sentence = _GREETING.sub("", sentence)
    if not _FIRST_PERSON.search(sentence) or is_sensitive(sentence):
        return None
    return _rewrite(sentence)


def statements(text: str) -> list[str]:
    """Notes worth keeping from one user message (may be empty)."""
    if len(text) > MAX_MESSAGE_CHARS or has_secret(text):
        return []
    notes: list[str] = []
    for sentence in _sentences(text):
        note = _statement(sentence)
        if note is not None and note not in notes:
            notes.append(note)
        if len(notes) >= MAX_NOTES_PER_TURN:
            break
    return notes


def attribute(note: str) -> str | None:
    """``"The user's name is"`` for ``"The user's name is Bob."``: what a newer note of the same
    attribute replaces (None for notes that state no single attribute)."""
    m = _ATTRIBUTE.match(note)
    return m.group(1).lower() if m else None
