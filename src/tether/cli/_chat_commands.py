"""What a line typed at the chat prompt is: a message for the model, or a slash-command.

A line that starts with ``/`` is never sent to the model: a command it does not know gets a hint
instead (a typo of ``/exit`` must not become the model's next question). A message that really
starts with ``/`` is typed with two, ``//like this``, and sent with one.
"""

from __future__ import annotations

from dataclasses import dataclass

COMMANDS: dict[str, str] = {
    "/help": "this list",
    "/history": "the conversation so far (the last {history} exchanges)",
    "/new": "start a new session with the same agent",
    "/exit": "leave (also /quit, or Ctrl-D); Ctrl-C at the prompt leaves too",
}
ALIASES = {"/quit": "/exit"}
HISTORY_EXCHANGES = 20
"""Exchanges ``/history`` shows (the newest)."""
RESUME_EXCHANGES = 3
"""Exchanges shown when a session with history is resumed."""


@dataclass(frozen=True, slots=True)
class Command:
    name: str
    """Lower-cased, aliases resolved; possibly a command that does not exist."""
    argument: str = ""

    @property
    def known(self) -> bool:
        return self.name in COMMANDS


def parse(line: str) -> str | Command | None:
    """``None`` for a blank line, a :class:`Command` for ``/…``, else the message to send."""
    line = line.strip()
    if not line:
        return None
    if line.startswith("//"):
        return line[1:]
    if line.startswith("/"):
        name, _, argument = line.partition(" ")
        name = name.lower()
        return Command(ALIASES.get(name, name), argument.strip())
    return line


def help_text() -> str:
    width = max(len(name) for name in COMMANDS)
    lines = [
        f"{name:<{width}}  {text.format(history=HISTORY_EXCHANGES)}"
        for name, text in COMMANDS.items()
    ]
    lines.append("Ctrl-C while a reply is streaming cancels it; //text sends a message '/text'.")
    return "\n".join(lines)


def unknown(command: Command) -> str:
    return (
        f"unknown command {command.name} (not sent to the model): /help lists the commands; "
        "start a message with // to send one that begins with /"
    )
