"""Which user messages become automatic notes, and how they read.

The tables are what README "What automatic notes keep" promises: each refused class has its own
table, and the kept table holds the harmless facts (and the punctuation) the refusals must not
catch.
"""

from __future__ import annotations

import pytest

from tether.memory.auto import MAX_MESSAGE_CHARS, attribute, statements


@pytest.mark.parametrize(
    ("text", "notes"),
    [
        ("My name is Alice", ["The user's name is Alice."]),
        ("Hi, my name is Alice.", ["The user's name is Alice."]),
        ("I'm 34 years old", ["The user is 34 years old."]),
        ("my favourite colour is green!", ["The user's favourite colour is green."]),
        ("I like pizza. Tell me a joke.", ['The user said: "I like pizza".']),
        ("What's my name?", []),
        ("Please write my essay", []),
        ("Can you remind me of my name", []),
        ("The sky is blue", []),
        ("My password is hunter2", []),
        ("my API key is sk-123 and my name is Ann", []),
        ("", []),
    ],
)
def test_statements(text: str, notes: list[str]) -> None:
    assert statements(text) == notes


# Sentences end at . ! ? and line ends, but not inside abbreviations, initials, decimals,
# emails, URLs or version numbers.
SENTENCES = [
    ("My name is Dr. Smith", ["The user's name is Dr. Smith."]),
    ("My name is Mr. Brown.", ["The user's name is Mr. Brown."]),
    ("My landlady is Mrs. Jones", ["The user's landlady is Mrs. Jones."]),
    ("My boss is Ms. Lee", ["The user's boss is Ms. Lee."]),
    (
        "My teacher is Prof. Ng. I live in St. Louis.",
        ["The user's teacher is Prof. Ng.", 'The user said: "I live in St. Louis".'],
    ),
    ("My name is J. Smith", ["The user's name is J. Smith."]),
    (
        "My favourite author is J. R. R. Tolkien.",
        ["The user's favourite author is J. R. R. Tolkien."],
    ),
    ("My height is 1.85 m.", ["The user's height is 1.85 m."]),
    ("My Python version is 3.12.1.", ["The user's Python version is 3.12.1."]),
    (
        "My website is https://ada.example.org/blog.",
        ["The user's website is https://ada.example.org/blog."],
    ),
    ("I wrote to ada.l@example.com. My name is Ada.", ["The user's name is Ada."]),
    (
        "My favourite fruits are e.g. mangoes and figs.",
        ["The user's favourite fruits are e.g. mangoes and figs."],
    ),
    ("My editor is Vim, i.e. the best one.", ["The user's editor is Vim, i.e. the best one."]),
    (
        "My favourite match was Nadal vs. Federer.",
        ["The user's favourite match was Nadal vs. Federer."],
    ),
    (
        "I like apples, pears etc. My name is Ann.",
        ['The user said: "I like apples, pears etc".', "The user's name is Ann."],
    ),
    ("my name is ann. i'm from lyon", ["The user's name is ann.", "The user is from lyon."]),
    ("My name is Ann!\nI'm a nurse", ["The user's name is Ann.", "The user is a nurse."]),
    ("My name is Ann.My dog is Rex.", ["The user's name is Ann.", "The user's dog is Rex."]),
    (
        "I live on Main St. My name is Ann.",
        ['The user said: "I live on Main St".', "The user's name is Ann."],
    ),
]


@pytest.mark.parametrize(("text", "notes"), SENTENCES)
def test_sentences_are_split_where_they_end(text: str, notes: list[str]) -> None:
    assert statements(text) == notes


def test_a_title_stays_with_the_name_it_replaces() -> None:
    (note,) = statements("My name is Dr. Smith")
    assert attribute(note) == attribute("The user's name is Alice.") == "the user's name is"
    assert "Smith" in note


# Useful, harmless facts: none of the refusals below may catch these.
KEPT = [
    ("I'm a software engineer", ["The user is a software engineer."]),
    ("I am a nurse.", ["The user is a nurse."]),
    ("I'm from Brazil.", ["The user is from Brazil."]),
    ("I live on Main Street.", ['The user said: "I live on Main Street".']),
    ("My dog is called Rex", ["The user's dog is called Rex."]),
    ("I speak French and German.", ['The user said: "I speak French and German".']),
    (
        "My favourite word is antidisestablishmentarianism.",
        ["The user's favourite word is antidisestablishmentarianism."],
    ),
    ("I work on internationalization.", ['The user said: "I work on internationalization".']),
    ("I have worked there from 2010-2015.", ["The user has worked there from 2010-2015."]),
    ("I was born in 1990 in Porto.", ["The user was born in 1990 in Porto."]),
    ("My favourite pink is 1234", ["The user's favourite pink is 1234."]),
    ("My secretary is Bob.", ["The user's secretary is Bob."]),
    (
        "My favourite book is The Philosopher's Stone.",
        ["The user's favourite book is The Philosopher's Stone."],
    ),
    ("My name is Christian.", ["The user's name is Christian."]),
    ("I work in hospitality.", ['The user said: "I work in hospitality".']),
    ("I study chemistry.", ['The user said: "I study chemistry".']),
    ("I live in Islamabad.", ['The user said: "I live in Islamabad".']),
    ("I have 3 St. Bernards.", ["The user has 3 St. Bernards."]),
    ("I earn 45 000 euros a year.", ['The user said: "I earn 45 000 euros a year".']),
    ("I was born on 1990-05-05.", ["The user was born on 1990-05-05."]),
    ("My phone is a Pixel 8.", ["The user's phone is a Pixel 8."]),
    ("I check my email every morning.", ['The user said: "I check my email every morning".']),
    ("My team uses PostgreSQL16.", ["The user's team uses PostgreSQL16."]),
]


@pytest.mark.parametrize(("text", "notes"), KEPT)
def test_harmless_facts_are_kept(text: str, notes: list[str]) -> None:
    assert statements(text) == notes


# A message that names a credential keeps no notes at all: the statement next to it may be the
# secret itself ("The password is below. I set it to hunter2.").
SECRET_WORDS = [
    "My passwords are hunter2 and hunter3",
    "My Password: hunter2",
    "my wifi passwd is hunter2",
    "My pwd is hunter2",
    "My passcodes are 1234 and 5678",
    "My passphrase is correct horse",
    "My PINs are 1234 and 9876",
    "My bank PIN code is 1234",
    "My private key is MIIEvQ",
    "My seed phrase is apple banana cherry",
    "My recovery phrase is apple banana cherry",
    "My wallet mnemonic is apple banana cherry",
    "My API keys are in the vault",
    "My api_key = abc123",
    "My AWS access key is in my notes",
    "My secret key is abc",
    "My tokens are in the vault",
    "My credentials are admin and admin",
    "My card's CVC is 123",
    "My CVV is 123",
    "My IBAN is DE89 3704 0044 0532 0130 00",
    "My account number is 12345678",
    "My routing number is 021000021",
    "My social security number is 078-05-1120",
    "My passport number is X1234567",
    "My mother's maiden name is Smith",
    "My 2FA backup codes are 1111 and 2222",
    "My name is Ann. The wifi password is below.\nI set it to hunter2.",
    # Found by a review after the first lists: logins, short or disguised words, codes.
    "My login is hunter2",
    "My username is ada and my pass is hunter2",
    "My p@ssword is hunter2",
    "I like cats. hunter2 is what I use to log in.",
    "The code to my door is 4455. I like dogs.",
    "My alarm code is 9911",
    # Found by a later review: a social security number as it is usually said.
    "My social is 078-05-1120.",
]


@pytest.mark.parametrize("text", SECRET_WORDS)
def test_credentials_are_refused_by_word(text: str) -> None:
    assert statements(text) == []


# Secrets without a telling word: refused by their shape, wherever they stand in the message.
SECRET_SHAPES = [
    "My card is 4111 1111 1111 1111",
    "I paid with 4111-1111-1111-1111 yesterday",
    "My number is 4012888888881881",
    "My AWS one is AKIAIOSFODNN7EXAMPLE",
    "My github one is ghp_a1B2c3D4e5F6g7H8i9J0k1L2m3N4o5P6q7R8",
    "I use github_pat_11ABCDEFG0123456789_abcdefghijklmnopqrstuvwxyz0123",
    "My openai one is sk-proj-abcdefghijklmnop1234567890",
    "My slack one is xoxb-123456789012-1234567890123-AbCdEfGhIjKl",
    "I got eyJhbGciOiJIUzI1NiJ9.eyJzdWIiOiIxMjM0NTY3ODkwIn0.dozjgNryP4J3jVmNHl0w5N_XgL0n3I9PlFU",
    "My name is Ann.\n-----BEGIN CERTIFICATE-----\nMIIBszCCAVmgAwIBAgIU\n-----END CERTIFICATE-----",
    "I paid with 4000 0212 3412 3412 344",  # 19 digits, 4-4-4-4-3 (no shorter prefix passes)
    "My amex is 3782-822463-10005",
    "My key is 9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08",
    "My wifi thing is 8fK2pQ9zL4mX7vR1tY6w",
    "I set it to wJalrXUtnFEMI/K7MDENG/bPxRfiCYEXAMPLEKEY",
    "Mine is 078-05-1120, I think",  # a social security number's shape
    "For the form: 078 05 1120",
]


@pytest.mark.parametrize("text", SECRET_SHAPES)
def test_secrets_are_refused_by_shape(text: str) -> None:
    assert statements(text) == []


# Special-category data (health, religion, sexual orientation, politics, ethnicity) is not kept.
SPECIAL = [
    "I have diabetes.",
    "I was diagnosed with ADHD last year.",
    "My medication is 20 mg of sertraline.",
    "I take insulin every morning.",
    "I am pregnant.",
    "I'm allergic to penicillin.",
    "I suffer from depression.",
    "My therapist is Dr. Weiss.",
    "I am Muslim.",
    "My religion is Catholicism.",
    "I'm gay.",
    "I am bisexual.",
    "I'm transgender.",
    "I vote Labour.",
    "I'm a member of the Republican party.",
    "My political views are left.",
    "My ethnicity is Han Chinese.",
    "I take 50mg of Zoloft.",
]


@pytest.mark.parametrize("text", SPECIAL)
def test_special_category_data_is_refused(text: str) -> None:
    assert statements(text) == []


# Precise contact data: street addresses with a house number, phone numbers, emails.
CONTACT = [
    "I live at 221B Baker Street.",
    "My address is 10 Downing Street, London.",
    "I live at Hauptstraße 5 in Berlin.",
    "I live at 12 rue de Rivoli.",
    "My phone number is +44 20 7946 0958.",
    "Call me on 06 12 34 56 78.",
    "I'm on (555) 123-4567 most days.",
    "My email is ada.l@example.com.",
    "My postcode is SW1A 1AA.",
    "Text me: 555-123-4567",
    "My email: ada(at)example.com",
    "My IP is 192.168.1.10",
]


@pytest.mark.parametrize("text", CONTACT)
def test_contact_data_is_refused(text: str) -> None:
    assert statements(text) == []


def test_a_refused_sentence_does_not_take_its_neighbours() -> None:
    assert statements("I have asthma. My name is Ann.") == ["The user's name is Ann."]


def test_a_long_message_is_not_read_for_notes() -> None:
    """A pasted document: no notes, and no time spent reading it."""
    padding = " It was a quiet day." * 300
    assert statements("My name is Ann." + padding[: MAX_MESSAGE_CHARS - 15]) == [
        "The user's name is Ann."
    ]
    assert statements("My name is Ann." + padding) == []


def test_notes_are_bounded() -> None:
    many = " ".join(f"My fact number {n} is {n}." for n in range(20))
    assert len(statements(many)) == 5
    assert statements("My " + "very " * 100 + "long sentence.") == []


def test_the_attribute_a_note_states() -> None:
    assert attribute("The user's name is Bob.") == "the user's name is"
    assert attribute("The user's Name is Bob.") == "the user's name is"
    assert attribute('The user said: "I like pizza".') is None
