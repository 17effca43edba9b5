"""Tasks run by a team of agents, one after another, in one session (PraisonAI's ``Task`` and
``AgentTeam``, sequential process).

Each task is one turn of its agent on the team's session, so the agents share the
conversation, and each task's prompt carries the outputs of the tasks it depends on (by
default the one before it). Every turn is an ordinary tether turn: serialized, stored, with an
honest outcome — a task whose turn does not complete raises :class:`tether.errors.TurnFailed`
and the tasks after it do not run.
"""

from __future__ import annotations

import secrets
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Literal

from tether.agent import Agent
from tether.embedded import default_runtime
from tether.errors import ConfigError
from tether.records import validate_session_id


@dataclass(eq=False)
class Task:
    """A unit of work for one agent: what to do, and what the result should look like."""

    action: str = ""
    expected_output: str = ""
    agent: Agent | None = None
    name: str = ""
    context: list[Task] = field(default_factory=list)
    """Tasks whose outputs this one is given (default: the task before it)."""
    description: str = ""
    """PraisonAI's older name for ``action``."""
    output: str | None = None
    """The agent's reply, once the task ran."""

    def __post_init__(self) -> None:
        self.action = self.action or self.description
        if not isinstance(self.action, str) or not self.action:
            raise ConfigError("a task needs an action (what it should accomplish), as text")
        if self.agent is not None and not isinstance(self.agent, Agent):
            raise ConfigError(f"task {self.label!r}: agent must be an Agent, not {self.agent!r}")
        if not isinstance(self.context, list | tuple) or not all(
            isinstance(t, Task) for t in self.context
        ):
            raise ConfigError(f"task {self.label!r}: context is a list of earlier tasks")
        self.context = list(self.context)

    @property
    def label(self) -> str:
        return self.name or self.action[:60]

    def prompt(self, given: Sequence[Task]) -> str:
        parts = [self.action]
        if self.expected_output:
            parts.append(f"Expected output: {self.expected_output}")
        for earlier in given:
            if earlier.output is not None:
                parts.append(f"Result of the earlier task {earlier.label!r}:\n{earlier.output}")
        return "\n\n".join(parts)


class AgentTeam:
    """Agents working through tasks in order, in one session of their own (or ``session_id``).

    Without ``tasks``, each agent gets one task: the ``start`` message (or, without one, its
    own instructions); with tasks, a ``start`` message heads the first task's prompt. Each
    ``start`` goes on in the team's session (its agents see the earlier runs).
    """

    def __init__(
        self,
        agents: Iterable[Agent],
        tasks: Iterable[Task] | None = None,
        *,
        process: Literal["sequential"] = "sequential",
        name: str = "",
        session_id: str | None = None,
    ) -> None:
        self.agents = list(agents)
        if not self.agents:
            raise ConfigError("an agent team needs at least one agent")
        if process != "sequential":
            raise ConfigError(f"process {process!r}: tether teams run tasks in sequence only")
        if not all(isinstance(a, Agent) for a in self.agents):
            raise ConfigError("an agent team's agents are Agent objects")
        self.tasks = list(tasks) if tasks is not None else []
        for n, task in enumerate(self.tasks):
            if not isinstance(task, Task):
                raise ConfigError(f"tasks are Task objects, not {task!r}")
            if task in self.tasks[:n]:
                raise ConfigError(f"task {task.label!r} is listed twice")
            if task.agent is None:
                task.agent = self.agents[0]
            elif task.agent not in self.agents:
                raise ConfigError(f"task {task.label!r}: its agent is not one of the team's")
            later = [t for t in task.context if t not in self.tasks[:n]]
            if later:
                raise ConfigError(
                    f"task {task.label!r}: its context names a task that does not run before it"
                )
        self.name = name
        self.session_id = validate_session_id(session_id or "team_" + secrets.token_urlsafe(12))

    def _planned(self, message: str | None) -> list[Task]:
        if self.tasks:
            return self.tasks
        return [Task(action=message or a.instructions, agent=a, name=a.name) for a in self.agents]

    async def _run(self, message: str | None) -> str:
        runtime = default_runtime().runtime  # on its own loop: see astart and start
        tasks = self._planned(message)
        for task in tasks:  # a run's outputs are its own: none is left from an earlier run
            task.output = None
        for n, task in enumerate(tasks):
            given = task.context or tasks[n - 1 : n]
            agent = task.agent or self.agents[0]
            prompt = task.prompt(given)
            if message is not None and self.tasks and n == 0:
                prompt = f"{message}\n\n{prompt}"  # the request the team was started with
            task.output = await runtime.chat(agent, prompt, session_id=self.session_id)
        return tasks[-1].output or ""

    async def astart(self, message: str | None = None) -> str:
        """Run every task in order; returns the last task's output."""
        return await default_runtime().acall(self._run(message))

    def start(self, message: str | None = None) -> str:
        """Run every task in order (blocking); returns the last task's output."""
        return default_runtime().call(self._run(message))
