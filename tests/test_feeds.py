"""The in-process feed registry: a follower that comes before its turn's worker is woken when
the feed opens, instead of finding it on its next look at the store."""

from __future__ import annotations

import asyncio

from tether.scheduler.feeds import Feeds, TurnFeed

NEVER = 3600.0
"""A wait no test sits out: only a wake-up ends it in time."""


async def test_followers_waiting_for_a_feed_wake_when_it_opens() -> None:
    feeds = Feeds()
    waiters = [asyncio.create_task(feeds.opened("t_1", NEVER)) for _ in range(3)]
    await asyncio.sleep(0)  # all three are waiting now
    assert not any(w.done() for w in waiters)
    feeds.open(TurnFeed("t_1"))
    await asyncio.wait_for(asyncio.gather(*waiters), 5)
    assert feeds["t_1"].turn_id == "t_1"


async def test_an_open_feed_needs_no_wait_and_a_wait_that_times_out_leaves_nothing() -> None:
    feeds = Feeds()
    feeds.open(TurnFeed("t_open"))
    await asyncio.wait_for(feeds.opened("t_open", NEVER), 5)
    await feeds.opened("t_other", 0.01)  # its turn runs elsewhere: back to the store
    assert feeds._openings == {}
    # One follower giving up does not strand another still waiting on the same turn.
    patient = asyncio.create_task(feeds.opened("t_2", NEVER))
    await asyncio.sleep(0)
    await feeds.opened("t_2", 0.01)
    feeds.open(TurnFeed("t_2"))
    await asyncio.wait_for(patient, 5)
    assert feeds._openings == {}
