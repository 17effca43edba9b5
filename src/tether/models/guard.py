"""A process-wide switch that stops real model providers, for test suites.

Tests set :data:`ALLOW_MODEL_REQUESTS` to false (tether's own suite does it in an autouse fixture)
so a test that reaches a real provider by accident fails loudly instead of calling out.
"""

from __future__ import annotations

from tether.errors import ModelRequestsForbidden

ALLOW_MODEL_REQUESTS = True


def ensure_requests_allowed(provider: str) -> None:
    """Raise :class:`ModelRequestsForbidden` when real model requests are switched off."""
    if not ALLOW_MODEL_REQUESTS:
        raise ModelRequestsForbidden(
            f"a real model request to {provider!r} was made while "
            "tether.models.guard.ALLOW_MODEL_REQUESTS is False; use tether.testing.ScriptedModel "
            "or mark the test with @pytest.mark.real_model"
        )
