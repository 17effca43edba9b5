"""Agents on OpenAI-compatible upstreams that fail, for tests of what callers may see.

``dead`` points at ``DEAD_UPSTREAM_URL`` (nothing listens; the URL carries a user and password),
``upstream`` at the fake OpenAI server of ``FAKE_OPENAI_URL``. Both send :data:`SERVER_KEY`, the
server's own provider key, which no caller may ever see.
"""

from __future__ import annotations

import os

from tether import Agent, App, RetryPolicy
from tether.models.openai import OpenAIModel
from tether.testing import ScriptedModel

SERVER_KEY = "sk-tether-own-provider-key-0123456789"
FAST = RetryPolicy(attempts=2, initial_backoff=0.01, max_backoff=0.02)

agents = [Agent(name="echo", model=ScriptedModel(default=lambda r: r.messages[-1].content))]
if os.environ.get("DEAD_UPSTREAM_URL"):
    dead = OpenAIModel("fake-model", base_url=os.environ["DEAD_UPSTREAM_URL"], api_key=SERVER_KEY)
    agents.append(Agent(name="dead", model=dead, retry=FAST))
if os.environ.get("FAKE_OPENAI_URL"):
    live = OpenAIModel("fake-model", base_url=os.environ["FAKE_OPENAI_URL"], api_key=SERVER_KEY)
    agents.append(Agent(name="upstream", model=live, retry=FAST))

app = App(agents=agents)
