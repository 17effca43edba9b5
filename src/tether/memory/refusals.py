"""What automatic notes refuse to keep: secrets, special-category data, precise contact data.

:mod:`tether.memory.auto` asks two questions of a message: :func:`has_secret` (the whole message
then gives no note: the sentence next to a secret may be the secret itself) and
:func:`is_sensitive` (that sentence is dropped, the rest is still read). README "What automatic
notes keep" says the same in plain words.

Matching is deliberately coarse: refusing a harmless sentence costs one note (the model still
has the history); keeping a secret stores it and recalls it into later prompts.
"""

from __future__ import annotations

import math
import re
from collections import Counter
from dataclasses import dataclass

# --- Word lists ------------------------------------------------------------------------------

_WORD = re.compile(r"[a-z0-9]+")


@dataclass(frozen=True)
class _WordList:
    """Entries looked up word by word, in time linear in the text (a regex alternation of a
    hundred entries costs about a microsecond per character).

    An entry is one or more words; an entry of several also matches them written together or
    joined by ``_`` or ``-`` ("api key", "api_key", "apikey"); every entry also matches with an
    ``s`` at its end ("pins", "api keys"). An entry ending in ``*`` is the start of a word
    ("password*" matches "passwords" and "password's"; "passwd" is an entry of its own).
    """

    words: frozenset[str]
    phrases: frozenset[tuple[str, ...]]
    heads: frozenset[str]  # first words of the phrases
    stems: dict[str, tuple[str, ...]]

    @classmethod
    def of(cls, *entries: str) -> _WordList:
        words: set[str] = set()
        phrases: set[tuple[str, ...]] = set()
        stems: dict[str, list[str]] = {}
        for entry in entries:
            if entry.endswith("*"):
                assert len(entry) > 4, entry  # stems are found by their first four letters
                stems.setdefault(entry[:4], []).append(entry[:-1])
                continue
            parts = tuple(_WORD.findall(entry))
            for form in (parts, (*parts[:-1], parts[-1] + "s")):
                words.add("".join(form))
                if len(form) > 1:
                    phrases.add(form)
        heads = frozenset(p[0] for p in phrases)
        return cls(
            frozenset(words), frozenset(phrases), heads, {k: tuple(v) for k, v in stems.items()}
        )

    def found_in(self, text: str) -> bool:
        tokens = _WORD.findall(text.lower().replace("’", "'"))
        for i, token in enumerate(tokens):
            if token in self.words or any(map(token.startswith, self.stems.get(token[:4], ()))):
                return True
            if token in self.heads and (
                tuple(tokens[i : i + 2]) in self.phrases or tuple(tokens[i : i + 3]) in self.phrases
            ):
                return True
        return False


# --- Secrets ---------------------------------------------------------------------------------

_SECRET_WORDS = _WordList.of(
    # passwords and codes
    "password*", "passwd*", "pwd", "pw", "passcode*", "pass code", "passphrase*", "pass phrase",
    "pin", "pin code", "pin number", "secret", "credential*", "creds",
    "otp", "totp", "2fa", "mfa code", "two factor", "one time code", "backup code", "recovery code",
    "verification code", "security code", "auth code", "authentication code",
    "security question", "security answer", "maiden name",
    "pass", "login*", "log in", "sign in", "username*", "user name",
    "door code", "alarm code", "gate code", "entry code", "lock code", "safe code",
    "access code", "combination*",
    # keys and tokens
    "private key", "secret key", "access key", "api key", "ssh key", "gpg key", "pgp key",
    "encryption key", "signing key", "master key", "recovery key", "wallet key", "license key",
    "licence key", "product key", "token", "seed phrase", "seed words", "recovery phrase",
    "mnemonic*",
    # money
    "credit card", "debit card", "card number", "card no", "card details", "cvv", "cvv2", "cvc",
    "cvc2", "iban", "swift code", "sort code", "routing number", "account number",
    "account no", "bank account", "bank details",
    # identity numbers
    "social security", "ssn", "social insurance number", "national insurance",
    "national id", "tax id", "tax number", "passport number", "passport no",
    "license number", "licence number", "id number",
)  # fmt: skip
# Key and token formats, looked for at the start of each long token of the message.
_KEY_FORMATS = re.compile(
    r"(?:AKIA|ASIA)[A-Z0-9]{16}"  # AWS access key id
    r"|gh[pousr]_[A-Za-z0-9]{20,}|github_pat_\w{20,}"  # GitHub tokens
    r"|sk-[A-Za-z0-9_-]{20,}|[rs]k_(?:live|test)_[A-Za-z0-9]{16,}"  # OpenAI, Stripe keys
    r"|xox[abposr]-[A-Za-z0-9-]{10,}"  # Slack tokens
    r"|AIza[\w-]{30,}"  # Google API key
    r"|eyJ[\w-]+\.eyJ[\w-]+\.[\w-]*"  # JWT: base64 of '{"' twice
    r"|[0-9a-fA-F]{32,}"  # a hex key or digest
)
_TOKEN = re.compile(r"[A-Za-z0-9+/=_.-]{16,}")
RANDOM_MIN_CHARS = 20
# A word-like stretch: three or more lower-case letters, a capital before them or not.
_WORDLIKE = re.compile(r"[A-Z]?[a-z]{3,}")
MIN_SECRET_BITS = 3.0  # Shannon entropy per character; random 20-character keys have about 4
_DIGIT_RUN = re.compile(r"\d(?:[ -]?\d)+")


def _luhn(digits: str) -> bool:
    total = 0
    for i, d in enumerate(reversed(digits)):
        n = int(d) * (2 if i % 2 else 1)
        total += n - 9 if n > 9 else n
    return total % 10 == 0


def _has_card_number(text: str) -> bool:
    """A Luhn-valid number of 13-19 digits, written together or in groups of 3-6 digits apart
    by spaces or hyphens ("4111 1111 1111 1111", "3782-822463-10005")."""
    for run in _DIGIT_RUN.finditer(text):
        groups = re.split(r"[ -]", run.group())
        for i, first in enumerate(groups):
            digits = first
            if 13 <= len(digits) <= 19 and _luhn(digits):
                return True
            for group in groups[i + 1 : i + 6]:  # 4-4-4-4-3 is the longest grouping
                if not (3 <= len(first) <= 6 and 3 <= len(group) <= 6):
                    break
                digits += group
                if len(digits) > 19:
                    break
                if len(digits) >= 13 and _luhn(digits):
                    return True
    return False


def _entropy(s: str) -> float:
    n = len(s)
    return -sum(c / n * math.log2(c / n) for c in Counter(s).values())


def _looks_random(token: str) -> bool:
    """Letters and digits mixed with high entropy, and not made of words: "8fK2pQ9zL4mX7vR1tY6w"
    is, "Windows10Pro2021Edition" and "antidisestablishmentarianism" are not."""
    letters = sum(c.isalpha() for c in token)
    if letters == 0 or letters == len(token) or _entropy(token) < MIN_SECRET_BITS:
        return False
    wordlike = sum(len(w) for w in _WORDLIKE.findall(token))
    return wordlike * 2 < letters


# "p@ssword", "pa$$word": the word lists are read with these letters put back.
_LEET = str.maketrans({"@": "a", "$": "s"})
# "The code to my door is 4455": a code or combination followed closely by a number; "my
# social is 078-05-1120", as a US social security number is said.
_CODE_AND_NUMBER = re.compile(r"\b(?:code|combo|social)s?\b[^.!?\n]{0,40}?\d{3,}", re.I)
# A US social security number's shape (3-2-4 digits), whatever words stand around it.
_SSN_SHAPE = re.compile(r"(?<![\d-])\d{3}[- ]\d{2}[- ]\d{4}(?![\d-])")


def has_secret(text: str) -> bool:
    if "-----BEGIN " in text or _SECRET_WORDS.found_in(text.translate(_LEET)):
        return True  # (a PEM block: a key or certificate)
    if _has_card_number(text) or _CODE_AND_NUMBER.search(text) or _SSN_SHAPE.search(text):
        return True
    for token in _TOKEN.findall(text):
        if _KEY_FORMATS.match(token.lstrip(".")):
            return True
        if any(len(p) >= RANDOM_MIN_CHARS and _looks_random(p) for p in token.split(".")):
            return True
    return False


# --- Special-category and contact data ----------------------------------------------------------

_SPECIAL = _WordList.of(
    # health: conditions, treatment, pregnancy, disability
    "diagnos*", "disease", "disorder", "syndrome", "illness", "medical", "chronic*", "symptom",
    "health condition", "mental health", "my health",
    "cancer", "tumor", "tumour", "diabet*", "asthma*", "epilep*", "hiv", "hepatitis", "covid",
    "arthritis", "dementia", "alzheimer*", "parkinson*", "migraine", "hypertension",
    "blood pressure", "cholesterol", "allerg*",
    "autism", "autistic", "adhd", "ocd", "ptsd", "bipolar", "schizophren*", "depressi*",
    "depressed", "anxiety", "panic attack", "anorexi*", "bulimi*", "addict*", "alcoholi*",
    "rehab", "overdose*", "suicid*", "self harm",
    "medication", "meds", "prescri*", "antidepressant", "insulin", "chemo", "chemotherapy",
    "surgery", "therap*", "psychiatr*", "hospitalised", "hospitalized",
    "pregnan*", "miscarriage", "abortion", "infertil*", "ivf",
    "disabilit*", "disabled", "wheelchair", "legally blind", "i'm blind", "am blind", "deaf",
    # religion and belief
    "religio*", "christianity", "a christian", "am christian", "i'm christian", "catholic*",
    "protestant*", "evangelical", "muslim", "islam", "islamic", "jew", "jewish", "judaism",
    "hindu*", "buddhis*", "sikh*", "mormon", "jehovah*", "atheis*", "agnostic",
    "church", "mosque", "synagogue", "pray*", "bible", "quran", "koran", "torah",
    # sexual orientation, sex life, gender identity
    "gay", "lesbian", "bisexual", "homosexual*", "heterosexual*", "asexual", "pansexual",
    "queer", "lgbt*", "sexual*", "sex life", "transgender", "trans", "non binary", "nonbinary",
    "intersex",
    # politics and trade-union membership
    "politic*", "democrat*", "republican*", "socialist", "socialism", "communist", "communism",
    "marxis*", "anarchis*", "fascis*", "libertarian*", "tory", "tories", "labour party",
    "green party", "conservative party", "left wing", "right wing", "vote", "voted", "voting",
    "trade union", "union member",
    # ethnicity and descent
    "ethnic*", "racial*", "my race", "descent", "caste", "indigenous",
    # genetic and biometric data, criminal records
    "genetic*", "dna", "blood type", "fingerprint", "criminal record", "convicted", "prison",
    "jail", "arrested", "felon*",
)  # fmt: skip
_DOSE = re.compile(r"\b\d+(?:[.,]\d+)?\s?(?:mg|mcg|µg)\b", re.I)  # "50mg of ..."
_CONTACT_WORDS = _WordList.of(
    "address*", "postcode", "post code", "zip code", "zipcode", "postal code", "po box",
    "p.o. box", "phone number", "telephone*", "mobile number", "cell number", "fax",
    "whatsapp",
)  # fmt: skip
# Street words that follow the street's name ("Baker Street") and those that follow the house
# number directly ("12 rue de Rivoli"); a house number with neither is not taken for an address
# ("I have 3 St. Bernards").
_STREET_AFTER_NAME = (
    r"street|st|avenue|ave|road|rd|boulevard|blvd|lane|ln|drive|dr|court|ct|place|pl|square|sq|"
    r"terrace|way|close|crescent|highway|hwy|parkway|alley|row|mews|grove|gardens|walk"
)
_STREET_AFTER_NUMBER = r"rue|avenue|boulevard|chemin|allée|impasse|quai|via|viale|calle|avenida|rua"
_CONTACT_SHAPES = re.compile(
    # "221B Baker Street", "12 rue de Rivoli"
    rf"\b\d{{1,5}}[a-zA-Z]?,?\s+(?:[A-Z][\w'’.-]*\s+){{1,4}}(?i:{_STREET_AFTER_NAME})\b"
    rf"|\b\d{{1,5}}[a-zA-Z]?,?\s+(?i:{_STREET_AFTER_NUMBER})\s"
    # "Via Roma 10", "Avenida Paulista 1000"
    r"|\b(?i:via|viale|calle|avenida|rua|piazza|plaza|carrer|corso)\s+"
    r"(?:(?:[A-Z][\w'’-]*|de|del|della|di|da|do|dos|la|el)\s+){1,4}\d{1,5}\b"
    # "Hauptstraße 5", "Kerkstraat 12"
    r"|\w(?i:straße|strasse|str\.|gasse|weg|platz|allee|straat|laan|gracht|vej|gade|gatan|"
    r"vägen|veien)\s+\d{1,5}[a-zA-Z]?\b"
    r"|(?i:\b(?:live|living|lives|stay|staying|reside|residing)\s+at\s+(?:no\.?\s*)?\d)"
    r"|\b[A-Z]{1,2}\d[A-Z\d]? ?\d[A-Z]{2}\b"  # UK postcode
    r"|[\w.+-]+@[\w-]+(?:\.[\w-]+)+"  # email address
    r"|(?i:\be-?mail(?:\s+address)?\s*(?:is\b|:))"  # "my email is ada at example dot com"
    r"|\b\d{1,3}(?:\.\d{1,3}){3}\b"  # IPv4 address
)
# Every contact shape holds a digit, an "@" or the word "mail": a cheap test first.
_MAY_BE_CONTACT = re.compile(r"[\d@]|mail", re.I)
_PHONE = re.compile(r"(?:\+|\(|\b)\d[\d ().-]*\d")
_NOT_PHONE = re.compile(
    r"\d{1,4}[./-]\d{1,2}[./-]\d{1,4}"  # a date
    r"|(?:1[89]|20)\d\d ?[-–] ?(?:1[89]|20)\d\d"  # a span of years
    r"|\d{1,3}(?:[ .]\d{3})+"  # a large number with thousands apart
    r"|\d{1,3}(?:\.\d{1,3}){3}"  # an IPv4 address
)


def _has_phone_number(sentence: str) -> bool:
    """7-15 digits written as a phone number: after "+", in groups, or ten or more together."""
    for m in _PHONE.finditer(sentence):
        number = m.group()
        digits = sum(c.isdigit() for c in number)
        if not 7 <= digits <= 15 or _NOT_PHONE.fullmatch(number):
            continue
        groups = [g for g in re.split(r"[ ().-]+", number) if g]
        if number.startswith("+") or len(groups) >= 2 or digits >= 10:
            return True
    return False


def is_sensitive(sentence: str) -> bool:
    return bool(
        _SPECIAL.found_in(sentence)
        or _DOSE.search(sentence)
        or _CONTACT_WORDS.found_in(sentence)
        or (_MAY_BE_CONTACT.search(sentence) is not None and _has_contact_shape(sentence))
    )


def _has_contact_shape(sentence: str) -> bool:
    return _CONTACT_SHAPES.search(sentence) is not None or _has_phone_number(sentence)
