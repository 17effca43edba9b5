"""A session's workspace is its own directory: no session id or principal name reaches outside it,
and no session's workspace contains another's (DESIGN §2, §7)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tether import Agent, ToolContext, tool
from tether.errors import ConfigError, ToolError
from tether.records import SessionKey
from tether.runtime import Runtime
from tether.store import InMemoryStore
from tether.testing import Call, ScriptedModel, ToolCalls
from tether.tools.workspace import (
    DEFAULT_QUOTA_BYTES,
    QUOTA_ENV,
    ROOT_ENV,
    check_quota,
    ensure_workspace,
    quota_from_env,
    remove_owner_workspaces,
    remove_workspace,
    usage,
    workspace_dir,
)


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
    """Ids full of dots (``.`` and ``..`` alone were valid until refused at every door); as path
    parts ``.`` and ``..`` would name the owner's and the
    tenant's directories, holding every other session's workspace."""
    model = ScriptedModel(
        default=lambda r: "done" if r.messages[-1].role == "tool" else ToolCalls(Call("where"))
    )
    agent = Agent(name="a", model=model, tools=[where], memory={"auto": False})
    async with Runtime(InMemoryStore(), data_dir=tmp_path, agents=[agent]) as rt:
        # (Ids of dots alone are refused at every door; raw keys of them are below.)
        for sid in ("plain", ".x", "x.."):
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


def test_a_workspace_is_made_for_its_user_alone(tmp_path: Path) -> None:
    key = SessionKey("acme", "alice", "s1")
    ws = ensure_workspace(workspace_dir(tmp_path, key))
    assert ws.is_dir() and ws.stat().st_mode & 0o777 == 0o700
    assert ensure_workspace(ws) == ws  # the next use finds it as it was


def test_quota_counts_files_not_what_links_point_at(tmp_path: Path) -> None:
    ws = ensure_workspace(tmp_path / "ws")
    big = tmp_path / "outside.bin"
    big.write_bytes(b"x" * 10_000)
    (ws / "a.txt").write_bytes(b"y" * 600)
    (ws / "link").symlink_to(big)
    held = usage(ws)
    assert 600 < held < 10_000  # the link counts for itself (its target's name), not 10,000
    check_quota(ws, quota=1000, adding=100)
    with pytest.raises(ToolError, match="quota of 1,000 bytes"):
        check_quota(ws, quota=1000, adding=held)
    # Rewriting a file in place counts only what it grows by.
    check_quota(ws, quota=1000, adding=900, replacing=600)


def test_quota_from_the_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(QUOTA_ENV, raising=False)
    assert quota_from_env() == DEFAULT_QUOTA_BYTES
    monkeypatch.setenv(QUOTA_ENV, "1.5")
    assert quota_from_env() == 1536 * 1024
    for bad in ("0", "-3", "lots"):
        monkeypatch.setenv(QUOTA_ENV, bad)
        with pytest.raises(ConfigError, match=QUOTA_ENV):
            quota_from_env()


def test_removing_a_workspace_never_follows_a_link_out(tmp_path: Path) -> None:
    root = tmp_path / "workspaces"
    alice, bob = SessionKey("t", "alice", "s1"), SessionKey("t", "bob", "s1")
    mine, theirs = (
        ensure_workspace(workspace_dir(root, alice)),
        ensure_workspace(workspace_dir(root, bob)),
    )
    (theirs / "keep.txt").write_text("bob's")
    (mine / "sub").mkdir()
    (mine / "sub" / "to-bob").symlink_to(theirs, target_is_directory=True)
    remove_workspace(root, alice)
    assert not mine.exists()
    assert (theirs / "keep.txt").read_text() == "bob's"
    remove_workspace(root, alice)  # gone already: nothing to do
    remove_owner_workspaces(root, "t", "bob")
    assert not theirs.exists() and root.exists()


def test_a_shared_root_is_a_setting(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(ROOT_ENV, raising=False)
    assert Runtime(InMemoryStore(), data_dir=tmp_path).workspace_root == tmp_path / "workspaces"
    monkeypatch.setenv(ROOT_ENV, str(tmp_path / "shared"))
    assert Runtime(InMemoryStore(), data_dir=tmp_path).workspace_root == tmp_path / "shared"
    given = tmp_path / "mine"
    assert Runtime(InMemoryStore(), data_dir=tmp_path, workspace_root=given).workspace_root == given


async def test_paths_given_as_text_are_paths(tmp_path: Path) -> None:
    """``Runtime(data_dir="…", workspace_root="…")`` as the README writes them: a str failed
    every turn's set-up (``str / str``) and the turn ended as if its process had died."""
    model = ScriptedModel(
        default=lambda r: "done" if r.messages[-1].role == "tool" else ToolCalls(Call("where"))
    )
    agent = Agent(name="a", model=model, tools=[where], memory={"auto": False})
    root = tmp_path / "ws"
    async with Runtime(
        InMemoryStore(), data_dir=str(tmp_path / "data"), agents=[agent], workspace_root=str(root)
    ) as rt:
        assert (rt.data_dir, rt.workspace_root) == (tmp_path / "data", root)
        assert await rt.chat(agent, "where?", session_id="s") == "done"
    seen = [Path(m.content) for r in model.requests for m in r.messages if m.role == "tool"]
    _confined(root, seen)
