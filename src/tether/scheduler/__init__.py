"""Scheduling: one turn per session at a time, on any number of processes (DESIGN §4).

:class:`Scheduler` (:mod:`.core`) accepts turns (:mod:`.admission`) and answers waits,
cancels and event streams; per-session workers hold the lease while they run the queue
(:mod:`.worker`), one turn at a time through the fenced sink (:mod:`.turn`, :mod:`.sink`);
background chores renew leases, deliver cancel requests, sweep and adopt orphans
(:mod:`.chores`); live event feeds (:mod:`.feeds`); owner ids (:mod:`.owners`); the session
service every front door uses (:mod:`.sessions`).
"""

from tether.scheduler.core import Scheduler, SchedulerStore
from tether.scheduler.runner import AgentResolver

__all__ = ["AgentResolver", "Scheduler", "SchedulerStore"]
