"""A session's workspace is its own directory: no session id or principal name reaches outside it,
and no session's workspace contains another's (DESIGN §2, §7)."""

from __future__ import annotations

from pathlib import Path

from tether import Agent, ToolContext, tool
from tether.records import SessionKey
from tether.runtime import Runtime
from tether.store import InMemoryStore
from tether.testing import Call, ScriptedModel, ToolCalls
from tether.tools.workspace import workspace_dir


@tool
def where(ctx: ToolContext) -> str:
    """Say where this session's workspace is."""
    return str(ctx.workspace)


def _confined(root: Path, paths: list[Path]) -> None:
    """Every path lies strictly inside ``root``, and none inside another (all distinct)."""
    assert len(set(paths)) == len(paths), paths
    for p in paths:
        assert p.resolve().is_relative_to(root.resolve()) and p.resolve() != root.resolve(), p
        for other in paths:
            if other != p:
                assert not other.resolve().is_relative_to(p.resolve()), (p, other)


async def test_dot_session_ids_get_workspaces_of_their_own(tmp_path: Path) -> None:
    """``.`` and ``..`` are valid session ids; as path parts they would name the owner's and the
    tenant's directories, holding every other session's workspace."""
    model = ScriptedModel(
        default=lambda r: "done" if r.messages[-1].role == "tool" else ToolCalls(Call("where"))
    )
    agent = Agent(name="a", model=model, tools=[where], memory={"auto": False})
    async with Runtime(InMemoryStore(), data_dir=tmp_path, agents=[agent]) as rt:
        for sid in ("plain", ".", ".."):
            assert await rt.chat(agent, "where?", session_id=sid) == "done"
    seen = [Path(m.content) for r in model.requests for m in r.messages if m.role == "tool"]
    assert len(seen) == 3
    _confined(tmp_path / "workspaces", seen)


def test_workspace_paths_never_follow_names() -> None:
    root = Path("/srv/tether/workspaces")
    keys = [
        SessionKey("acme", "alice", "s1"),
        SessionKey("acme", "alice", "."),
        SessionKey("acme", "alice", ".."),
        SessionKey("acme", "..", ".."),
        SessionKey("..", "..", ".."),
        SessionKey("acme", "../../etc", "s1"),  # a key minted for an odd user name
        SessionKey("acme", "alice/s1", "x"),  # "/" may not join two names into one path
        SessionKey("acme/alice", "s1", "x"),
        SessionKey("acme", "bob", "s1"),
        SessionKey("other", "alice", "s1"),
    ]
    paths = [workspace_dir(root, k) for k in keys]
    _confined(root, paths)
    # Stable: the same session finds the same workspace in every process.
    assert workspace_dir(root, SessionKey("acme", "alice", "s1")) == paths[0]
    # Every session's workspace lies inside its owner's directory, shared with no other owner.
    owners = {workspace_dir(root, k).parent for k in keys}
    assert len(owners) == len({(k.tenant, k.owner) for k in keys})
