"""The README's "Testing your own agents" example runs as written (pasted into a test module)."""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest

from tether.models import guard

README = Path(__file__).resolve().parents[1] / "README.md"


def _example() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Testing your own agents", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, re.DOTALL)
    assert len(blocks) == 1, "the section should have one Python example"
    return str(blocks[0])


async def test_the_readme_testing_example_runs_and_blocks_real_providers(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(guard, "ALLOW_MODEL_REQUESTS", True)  # restored afterwards
    module: dict[str, Any] = {"__name__": "readme_example"}
    exec(compile(_example(), str(README), "exec"), module)
    assert guard.ALLOW_MODEL_REQUESTS is False
    await module["test_it_answers"]()
