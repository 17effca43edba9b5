"""@tool: schemas from signatures and docstrings, sync and async, context, validation."""

from __future__ import annotations

import asyncio
import threading
from typing import Literal

import pytest

from tether import ConfigError, InvalidInput, ToolContext, tool
from tether.records import LOCAL_PRINCIPAL, SessionKey


def _ctx() -> ToolContext:
    return ToolContext(
        session=SessionKey("local", "local", "s"),
        principal=LOCAL_PRINCIPAL,
        turn_id="t",
        call_id="c",
        cancelled=asyncio.Event(),
    )


@tool
def get_weather(city: str, unit: Literal["c", "f"] = "c", days: int = 1) -> dict[str, object]:
    """Get the weather forecast.

    Args:
        city: Name of the city.
        unit: Temperature unit,
            Celsius or Fahrenheit.
        days: How many days ahead.

    Returns:
        A forecast.
    """
    return {"city": city, "unit": unit, "days": days, "thread": threading.get_ident()}


def test_schema_comes_from_signature_and_docstring() -> None:
    assert get_weather.name == "get_weather"
    assert get_weather.description == "Get the weather forecast."
    params = get_weather.parameters
    assert params["required"] == ["city"]
    assert params["additionalProperties"] is False
    props = params["properties"]
    assert props["city"] == {"type": "string", "description": "Name of the city."}
    assert props["unit"]["enum"] == ["c", "f"]
    assert props["unit"]["description"] == "Temperature unit, Celsius or Fahrenheit."
    assert props["days"]["type"] == "integer" and props["days"]["default"] == 1


async def test_sync_tool_runs_in_a_worker_thread_and_result_is_json() -> None:
    out = await get_weather.invoke('{"city": "Oslo", "days": 2}', _ctx())
    assert '"city": "Oslo"' in out and '"days": 2' in out
    assert f'"thread": {threading.get_ident()}' not in out


async def test_invalid_arguments_are_typed_errors() -> None:
    with pytest.raises(InvalidInput, match="city"):
        await get_weather.invoke('{"days": 2}', _ctx())
    with pytest.raises(InvalidInput, match="unit"):
        await get_weather.invoke('{"city": "x", "unit": "kelvin"}', _ctx())
    with pytest.raises(InvalidInput):
        await get_weather.invoke("not json", _ctx())
    with pytest.raises(InvalidInput, match="evil: Extra inputs"):
        await get_weather.invoke('{"city": "x", "evil": 1}', _ctx())


async def test_async_tool_with_context_hides_context_from_schema() -> None:
    @tool(name="whoami", read_only=True, timeout=3)
    async def who(ctx: ToolContext, greeting: str = "hi") -> str:
        """Say who is calling."""
        return f"{greeting} {ctx.principal.user} in {ctx.session.session_id}"

    assert who.parameters["properties"].keys() == {"greeting"}
    assert who.read_only and who.timeout == 3
    assert await who.invoke("{}", _ctx()) == "hi local in s"


def test_bad_tool_definitions_are_config_errors() -> None:
    with pytest.raises(ConfigError):

        @tool(name="has space")
        def a() -> str:
            return ""

    with pytest.raises(ConfigError):

        @tool
        def b(*args: int) -> str:
            return ""
