"""The app the remote examples serve in a real ``tether serve``: the seed's "Remote Agent
Server" agent, on the process's default model (``TETHER_MODEL``: the fake OpenAI server). The
seed serves it with Flask and a hand-written ``/agent`` route; tether serves that contract
itself (``POST /agent``, ``POST /agents/{name}``)."""

from __future__ import annotations

from tether import Agent, App

app = App(
    agents=[
        Agent(
            name="Remote Assistant",
            instructions="You are a helpful remote assistant.",
            memory=True,
        )
    ]
)
