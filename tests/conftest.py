from __future__ import annotations

from collections.abc import Iterator

import pytest

from tether.models import guard


@pytest.fixture(autouse=True)
def _forbid_real_models(request: pytest.FixtureRequest) -> Iterator[None]:
    """Any real provider call fails unless the test is marked ``real_model``."""
    allowed = request.node.get_closest_marker("real_model") is not None
    previous = guard.ALLOW_MODEL_REQUESTS
    guard.ALLOW_MODEL_REQUESTS = allowed
    try:
        yield
    finally:
        guard.ALLOW_MODEL_REQUESTS = previous
