"""The LangGraph Agent Server face: the Agent Protocol dialect ``langgraph-sdk`` and
agent-chat-ui speak, served under ``/lg`` (``get_client(url="<server>/lg", api_key=…)``).

* assistants (:mod:`.assistants`) are the app's agents: ``assistant_id`` = ``graph_id`` = the
  agent's name;
* threads (:mod:`.threads`) are the caller's sessions, their ``values`` the session's messages
  as LangChain message dicts;
* runs (:mod:`.runs`) are turns, submitted through :mod:`tether.server.conversation` like every
  other door's, with the same principal (``X-Api-Key`` or a bearer token) and the same 404 for
  a thread that is not the caller's; their streams are made from the turns' events
  (:mod:`._stream`).

Errors are LangGraph's ``{"detail": …}`` (with tether's stable ``code``). The routes stay out of
tether's OpenAPI document: they are another API's, documented by LangGraph, and their loose
bodies are read by hand the way LangGraph's own servers accept them. ``TETHER_FACES_LANGGRAPH=off``
turns the face off.
"""

from __future__ import annotations

from fastapi import APIRouter

from tether.server.faces.langgraph import assistants, runs, threads

PREFIX = "/lg"

router = APIRouter(prefix=PREFIX, tags=["langgraph"], include_in_schema=False)
for _part in (assistants.router, threads.router, runs.router):
    router.include_router(_part)
