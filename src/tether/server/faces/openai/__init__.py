"""The OpenAI-compatible face (DESIGN §9): models, chat completions and the Responses API, each
a thin adapter over the scheduler every other door uses."""

from __future__ import annotations

from fastapi import APIRouter

from tether.server.faces.openai import chat, responses

router = APIRouter()
router.include_router(chat.router)
router.include_router(responses.router)

__all__ = ["router"]
