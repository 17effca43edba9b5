"""``@tool``: a typed Python function (sync or async) becomes a tool the model can call.

The JSON schema comes from the signature (via pydantic, which also validates the model's
arguments) and the description from the docstring, including Google-style ``Args:`` entries.
"""

from __future__ import annotations

import inspect
import json
import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from typing import Any, cast, get_type_hints, overload

import anyio.to_thread
import pydantic
from pydantic_core import to_jsonable_python

from tether.errors import ConfigError, InvalidInput
from tether.models.base import ToolSpec
from tether.tools.context import ToolContext

_NAME = re.compile(r"^[a-zA-Z0-9_-]{1,64}$")


@dataclass(frozen=True, slots=True)
class Tool:
    name: str
    description: str
    parameters: dict[str, Any]
    function: Callable[..., Any] = field(repr=False)
    args_model: type[pydantic.BaseModel] = field(repr=False)
    context_param: str | None = None
    requires_approval: bool = False
    """The call waits for a human decision; no decision means it does not run."""
    read_only: bool = False
    """The tool changes nothing (it only reads), so consecutive read-only calls of one model step
    run at the same time; any other call runs alone, in the order the model made it."""
    timeout: float | None = None
    """Seconds before the call is abandoned, its ``ToolContext.cancelled`` set and the model told
    it timed out."""

    @property
    def spec(self) -> ToolSpec:
        return ToolSpec(self.name, self.description, self.parameters)

    def parse_arguments(self, arguments: str) -> dict[str, Any]:
        """Validate the model's JSON arguments; InvalidInput with a readable reason otherwise."""
        try:
            parsed = self.args_model.model_validate_json(arguments or "{}")
        except pydantic.ValidationError as exc:
            problems = "; ".join(
                f"{'.'.join(str(p) for p in e['loc']) or 'arguments'}: {e['msg']}"
                for e in exc.errors()
            )
            raise InvalidInput(f"invalid arguments for {self.name}: {problems}") from None
        return {name: getattr(parsed, name) for name in type(parsed).model_fields}

    async def invoke(self, arguments: str, context: ToolContext) -> str:
        """Run the tool and render its result as text for the model."""
        kwargs = self.parse_arguments(arguments)
        if self.context_param is not None:
            kwargs[self.context_param] = context
        if inspect.iscoroutinefunction(self.function):
            result = await cast(Callable[..., Awaitable[Any]], self.function)(**kwargs)
        else:
            # A sync tool runs in a worker thread so it never blocks the event loop; on
            # cancellation the thread is abandoned (Python cannot interrupt it) and the
            # tool's ToolContext.cancelled is set so it can notice.
            result = await anyio.to_thread.run_sync(
                lambda: self.function(**kwargs), abandon_on_cancel=True
            )
        if isinstance(result, str):
            return result
        return json.dumps(to_jsonable_python(result), ensure_ascii=False)


class _AnyArguments(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="allow")


@dataclass(frozen=True, slots=True)
class SchemaTool(Tool):
    """A tool described by a JSON schema rather than a Python signature (an MCP server's tool):
    the model's arguments reach ``function`` (an async ``call(arguments, context)``) as one
    dict, checked only to be a JSON object, since the schema is the callee's to enforce."""

    def parse_arguments(self, arguments: str) -> dict[str, Any]:
        try:
            parsed = json.loads(arguments or "{}")
        except ValueError:
            raise InvalidInput(f"invalid arguments for {self.name}: not JSON") from None
        if not isinstance(parsed, dict):
            raise InvalidInput(f"invalid arguments for {self.name}: not a JSON object")
        return cast(dict[str, Any], parsed)

    async def invoke(self, arguments: str, context: ToolContext) -> str:
        call = cast(Callable[[dict[str, Any], ToolContext], Awaitable[str]], self.function)
        return await call(self.parse_arguments(arguments), context)


def schema_tool(
    name: str,
    description: str,
    parameters: dict[str, Any],
    call: Callable[[dict[str, Any], ToolContext], Awaitable[str]],
    *,
    requires_approval: bool = False,
    read_only: bool = False,
    timeout: float | None = None,
) -> Tool:
    """A tool from a JSON schema and an async ``call(arguments, context) -> text``."""
    if not _NAME.match(name):
        raise ConfigError(f"tool name {name!r} must be 1-64 of [a-zA-Z0-9_-]")
    return SchemaTool(
        name=name,
        description=description or name,
        parameters=parameters,
        function=call,
        args_model=_AnyArguments,
        requires_approval=requires_approval,
        read_only=read_only,
        timeout=timeout,
    )


def _parse_docstring(doc: str | None) -> tuple[str, dict[str, str]]:
    if not doc:
        return "", {}
    doc = inspect.cleandoc(doc)
    summary_lines: list[str] = []
    params: dict[str, str] = {}
    section: str | None = None
    current: str | None = None
    for line in doc.splitlines():
        stripped = line.strip()
        header = stripped.rstrip(":").lower()
        if stripped.endswith(":") and header in {"args", "arguments", "parameters", "params"}:
            section, current = "args", None
            continue
        if stripped.endswith(":") and header in {"returns", "raises", "yields", "examples"}:
            section, current = "other", None
            continue
        if section == "args":
            m = re.match(r"^(\w+)\s*(?:\([^)]*\))?\s*:\s*(.*)$", stripped)
            if m and line.startswith((" ", "\t")) and not line.startswith(" " * 8):
                current = m.group(1)
                params[current] = m.group(2)
            elif current and stripped:
                params[current] = f"{params[current]} {stripped}".strip()
        elif section is None:
            summary_lines.append(line)
    return "\n".join(summary_lines).strip(), params


def _build(
    fn: Callable[..., Any],
    *,
    name: str | None,
    description: str | None,
    requires_approval: bool,
    read_only: bool,
    timeout: float | None,
) -> Tool:
    tool_name = name or fn.__name__
    if not _NAME.match(tool_name):
        raise ConfigError(f"tool name {tool_name!r} must be 1-64 of [a-zA-Z0-9_-]")
    summary, param_docs = _parse_docstring(fn.__doc__)
    hints = get_type_hints(fn)
    fields: dict[str, Any] = {}
    context_param: str | None = None
    for pname, param in inspect.signature(fn).parameters.items():
        annotation = hints.get(pname, Any)
        if annotation is ToolContext:
            context_param = pname
            continue
        if param.kind in (param.VAR_POSITIONAL, param.VAR_KEYWORD):
            raise ConfigError(f"tool {tool_name}: *args/**kwargs cannot be described to a model")
        default = ... if param.default is inspect.Parameter.empty else param.default
        fields[pname] = (
            annotation,
            pydantic.Field(default=default, description=param_docs.get(pname)),
        )
    args_model = pydantic.create_model(
        f"{tool_name}_args",
        __config__=pydantic.ConfigDict(extra="forbid"),
        **fields,
    )
    schema = args_model.model_json_schema()
    schema.pop("title", None)
    for prop in schema.get("properties", {}).values():
        prop.pop("title", None)
    return Tool(
        name=tool_name,
        description=description or summary or tool_name,
        parameters=schema,
        function=fn,
        args_model=args_model,
        context_param=context_param,
        requires_approval=requires_approval,
        read_only=read_only,
        timeout=timeout,
    )


@overload
def tool(fn: Callable[..., Any], /) -> Tool: ...


@overload
def tool(
    *,
    name: str | None = None,
    description: str | None = None,
    requires_approval: bool = False,
    read_only: bool = False,
    timeout: float | None = None,
) -> Callable[[Callable[..., Any]], Tool]: ...


def tool(
    fn: Callable[..., Any] | None = None,
    /,
    *,
    name: str | None = None,
    description: str | None = None,
    requires_approval: bool = False,
    read_only: bool = False,
    timeout: float | None = None,
) -> Tool | Callable[[Callable[..., Any]], Tool]:
    """Make a tool of a typed function: ``@tool`` or ``@tool(timeout=5, read_only=True)``."""

    def wrap(f: Callable[..., Any]) -> Tool:
        return _build(
            f,
            name=name,
            description=description,
            requires_approval=requires_approval,
            read_only=read_only,
            timeout=timeout,
        )

    return wrap(fn) if fn is not None else wrap
