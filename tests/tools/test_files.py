"""File tools reach their own session's workspace and nothing else (DESIGN §7, issue 16).

Session A (alice) tries every way out towards session B (bob) of the same runtime: ``..``, B's
absolute path, a symlink, a hard link, a device file, a link swapped in between check and use.
Every attempt is refused with a tool error the model reads, and B's files stay as they were.
"""

from __future__ import annotations

import asyncio
import json
import os
import stat
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from tether import Agent, Principal, ToolContext
from tether.errors import InvalidSessionId, ToolError
from tether.records import SessionKey
from tether.runtime import Runtime
from tether.store import InMemoryStore
from tether.testing import Call, ScriptedModel, ToolCalls
from tether.tools import FILE_TOOLS, READ_ONLY_FILE_TOOLS, Tool, confined
from tether.tools import files as ft
from tether.tools.files import (
    READ_LIMIT_BYTES,
    SEARCH_MATCH_LIMIT,
    WRITE_LIMIT_BYTES,
    append_file,
    delete_file,
    list_files,
    read_file,
    search_files,
    write_file,
)
from tether.tools.workspace import ensure_workspace, workspace_dir

ALICE = Principal("acme", "alice")
BOB = Principal("acme", "bob")
SECRET = "bob's secret: 7f3a"


@dataclass
class Driver:
    """Runs one tool call per turn through a real runtime and returns what the model read."""

    rt: Runtime
    agent: Agent
    model: ScriptedModel

    async def call(self, who: Principal, session: str, name: str, **args: Any) -> str:
        self.model.script(ToolCalls(Call(name, args)), "done")
        reply = await self.rt.chat(self.agent, "go", session_id=session, principal=who)
        assert reply == "done"
        result = self.model.requests[-1].messages[-1]
        assert result.role == "tool"
        return result.content

    def workspace(self, who: Principal, session: str) -> Path:
        return workspace_dir(self.rt.workspace_root, SessionKey(who.tenant, who.user, session))


@pytest.fixture
async def driver(tmp_path: Path) -> AsyncIterator[Driver]:
    model = ScriptedModel()
    agent = Agent(name="files", model=model, tools=[*FILE_TOOLS], memory={"auto": False})
    async with Runtime(
        InMemoryStore(), data_dir=tmp_path, agents=[agent], workspace_quota=4 * 1024 * 1024
    ) as rt:
        yield Driver(rt, agent, model)


def _ctx(workspace: Path | None, quota: int = 10 * 1024 * 1024) -> ToolContext:
    return ToolContext(
        session=SessionKey("acme", "alice", "s1"),
        principal=ALICE,
        turn_id="t1",
        call_id="c1",
        cancelled=asyncio.Event(),
        workspace=workspace,
        workspace_quota=quota,
    )


async def _invoke(t: Tool, ctx: ToolContext, **args: Any) -> str:
    return await t.invoke(json.dumps(args), ctx)


def test_the_tool_sets() -> None:
    names = [t.name for t in FILE_TOOLS]
    assert names == [
        "read_file",
        "write_file",
        "append_file",
        "list_files",
        "search_files",
        "delete_file",
    ]
    assert {t.name for t in READ_ONLY_FILE_TOOLS} == {"read_file", "list_files", "search_files"}
    assert all(t.read_only == (t in READ_ONLY_FILE_TOOLS) for t in FILE_TOOLS)
    # The context never reaches the model's schema.
    assert all("ctx" not in t.parameters["properties"] for t in FILE_TOOLS)


async def test_each_tool_through_a_turn(driver: Driver) -> None:
    call = driver.call
    assert await call(ALICE, "a", "list_files") == "[the workspace is empty]"
    assert await call(ALICE, "a", "read_file", path="notes/todo.md") == (
        "Error: 'notes/todo.md' not found in the workspace"
    )
    assert await call(ALICE, "a", "write_file", path="notes/todo.md", content="one\ntwo\n") == (
        "wrote 8 bytes to 'notes/todo.md'"
    )
    assert "now holds 14 bytes" in await call(
        ALICE, "a", "append_file", path="notes/todo.md", content="three\n"
    )
    assert await call(ALICE, "a", "read_file", path="notes/todo.md") == "one\ntwo\nthree\n"
    assert await call(ALICE, "a", "read_file", path="./notes//todo.md", offset=2, limit=1) == (
        "two\n[lines 2-2 shown; the file goes on: read_file with offset=3 for more]"
    )
    assert await call(ALICE, "a", "list_files") == "notes/"
    assert await call(ALICE, "a", "list_files", path="notes") == "todo.md  (14 bytes)"
    assert await call(ALICE, "a", "search_files", pattern="tw") == "notes/todo.md:2: two"
    assert await call(ALICE, "a", "search_files", pattern=r"^t\w+e$", regex=True) == (
        "notes/todo.md:3: three"
    )
    ws = driver.workspace(ALICE, "a")
    assert (ws / "notes" / "todo.md").read_text() == "one\ntwo\nthree\n"
    assert stat.S_IMODE(ws.stat().st_mode) == 0o700
    assert await call(ALICE, "a", "delete_file", path="notes/todo.md") == (
        "deleted 'notes/todo.md'"
    )
    assert await call(ALICE, "a", "delete_file", path="notes") == ("deleted the directory 'notes'")
    assert list(ws.iterdir()) == []


async def test_each_tool_called_directly(tmp_path: Path) -> None:
    ws = tmp_path / "ws"
    ctx = _ctx(ws)
    assert list_files.function(ctx) == "[the workspace is empty]"
    assert not ws.exists()  # reading makes nothing
    assert write_file.function(ctx, "a.txt", "héllo\n") == "wrote 7 bytes to 'a.txt'"
    assert ws.is_dir()
    assert "now holds 13 bytes" in append_file.function(ctx, "a.txt", "world\n")
    assert read_file.function(ctx, "a.txt") == "héllo\nworld\n"
    assert await _invoke(read_file, ctx, path="a.txt", offset=2) == "world\n"
    assert list_files.function(ctx, ".") == "a.txt  (13 bytes)"
    assert search_files.function(ctx, "wor") == "a.txt:2: world"
    assert await _invoke(search_files, ctx, pattern="nothing") == "no matches for 'nothing' in '.'"
    assert delete_file.function(ctx, "a.txt") == "deleted 'a.txt'"
    with pytest.raises(ToolError, match=r"'a.txt' not found in the workspace"):
        delete_file.function(ctx, "a.txt")


@pytest.mark.parametrize("t", FILE_TOOLS, ids=lambda t: t.name)
async def test_no_workspace_no_file_tools(t: Tool) -> None:
    args = {"pattern": "x"} if t is search_files else {"path": "a.txt"}
    if t in (write_file, append_file):
        args["content"] = "x"
    with pytest.raises(ToolError, match="this runtime has no workspaces"):
        await _invoke(t, _ctx(None), **args)


def test_a_workspace_not_made_yet_reads_as_empty(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path / "never")
    assert search_files.function(ctx, "x") == "no matches for 'x': the workspace is empty"
    for fn in (read_file.function, delete_file.function):
        with pytest.raises(ToolError, match=r"'a.txt' not found"):
            fn(ctx, "a.txt")
    with pytest.raises(ToolError, match="'sub' not found"):
        list_files.function(ctx, "sub")
    assert not (tmp_path / "never").exists()


@pytest.mark.parametrize(
    ("path", "why"),
    [
        ("/etc/passwd", "is an absolute path"),
        ("../x", "climbs with '..'"),
        ("a/../../x", "climbs with '..'"),
        ("a/..", "climbs with '..'"),
        ("a\x00b", "NUL byte"),
        ("a" * 2000, "longer than 1024"),
    ],
)
def test_path_forms_that_would_leave(tmp_path: Path, path: str, why: str) -> None:
    ctx = _ctx(tmp_path / "ws")
    calls: list[Callable[[], str]] = [
        lambda: read_file.function(ctx, path),
        lambda: write_file.function(ctx, path, "x"),
        lambda: append_file.function(ctx, path, "x"),
        lambda: list_files.function(ctx, path),
        lambda: search_files.function(ctx, "x", path),
        lambda: delete_file.function(ctx, path),
    ]
    for fn in calls:
        with pytest.raises(ToolError, match=why):
            fn()


def test_the_workspace_itself_is_not_a_file(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path / "ws")
    for path in ("", ".", "./"):
        with pytest.raises(ToolError, match="names the workspace itself"):
            write_file.function(ctx, path, "x")
        with pytest.raises(ToolError, match="names the workspace itself"):
            delete_file.function(ctx, path)


# -- A against B -----------------------------------------------------------------------------


@dataclass
class TwoSessions:
    a: Path
    b: Path
    secret: Path


@pytest.fixture
async def two(driver: Driver) -> TwoSessions:
    assert "wrote" in await driver.call(BOB, "s1", "write_file", path="secret.txt", content=SECRET)
    assert "wrote" in await driver.call(ALICE, "s1", "write_file", path="mine.txt", content="a")
    b = driver.workspace(BOB, "s1")
    return TwoSessions(driver.workspace(ALICE, "s1"), b, b / "secret.txt")


def _b_unchanged(two: TwoSessions) -> None:
    assert two.secret.read_text() == SECRET
    assert sorted(p.name for p in two.b.iterdir()) == ["secret.txt"]


async def _every_way(driver: Driver, path: str) -> list[str]:
    """What session A reads for each tool pointed at ``path``."""
    call = driver.call
    return [
        await call(ALICE, "s1", "read_file", path=path),
        await call(ALICE, "s1", "list_files", path=path),
        await call(ALICE, "s1", "write_file", path=path, content="pwned"),
        await call(ALICE, "s1", "append_file", path=path, content="pwned"),
        await call(ALICE, "s1", "search_files", pattern="secret", path=path),
        await call(ALICE, "s1", "delete_file", path=path),
    ]


def _all_refused(results: list[str], why: str, tmp_path: Path, given: str) -> None:
    for result in results:
        assert result.startswith("Error: "), result
        assert why in result, result
        assert "7f3a" not in result
        # The host path (so the data dir) shows only where the model wrote it itself.
        assert str(tmp_path) not in result.replace(repr(given), ""), result


def _relative(path: Path, start: Path) -> str:
    return os.path.relpath(path, start)


async def test_dot_dot_towards_b(driver: Driver, two: TwoSessions, tmp_path: Path) -> None:
    up_one = _relative(two.secret, two.a)  # ../../<bob>/<b>/secret.txt
    assert up_one.startswith("..")
    _all_refused(await _every_way(driver, up_one), "climbs with '..'", tmp_path, up_one)
    _b_unchanged(two)


async def test_bs_absolute_path(driver: Driver, two: TwoSessions, tmp_path: Path) -> None:
    for path in (str(two.secret), str(two.b)):
        results = await _every_way(driver, path)
        _all_refused(results, "is an absolute path", tmp_path, path)
    _b_unchanged(two)


async def test_symlinks_into_b(driver: Driver, two: TwoSessions, tmp_path: Path) -> None:
    (two.a / "to-b").symlink_to(two.b, target_is_directory=True)
    (two.a / "secret-link").symlink_to(two.secret)
    (two.a / "relative-link").symlink_to(_relative(two.secret, two.a))
    (two.a / "inside").symlink_to("mine.txt")  # even a link that stays inside is refused
    for path in ("to-b", "to-b/secret.txt", "secret-link", "relative-link", "inside"):
        _all_refused(await _every_way(driver, path), "is a symbolic link", tmp_path, path)
    # Through a link as a directory on the way: also for writes making new files.
    result = await driver.call(ALICE, "s1", "write_file", path="to-b/new.txt", content="x")
    assert "'to-b' is a symbolic link" in result
    # A search of the whole workspace passes links by, and says so.
    found = await driver.call(ALICE, "s1", "search_files", pattern="7f3a")
    assert found.startswith("no matches") and "links" in found
    listing = await driver.call(ALICE, "s1", "list_files")
    assert "to-b  (symbolic link, not followed)" in listing and "7f3a" not in listing
    _b_unchanged(two)
    assert (two.a / "to-b").is_symlink()  # the link was refused, not deleted


async def test_a_hard_link_to_bs_file(driver: Driver, two: TwoSessions, tmp_path: Path) -> None:
    os.link(two.secret, two.a / "hard.txt")
    for result in [
        await driver.call(ALICE, "s1", "read_file", path="hard.txt"),
        await driver.call(ALICE, "s1", "write_file", path="hard.txt", content="pwned"),
        await driver.call(ALICE, "s1", "append_file", path="hard.txt", content="pwned"),
        await driver.call(ALICE, "s1", "delete_file", path="hard.txt"),
    ]:
        assert result.startswith("Error: 'hard.txt' has 2 hard links"), result
        assert str(tmp_path) not in result
    found = await driver.call(ALICE, "s1", "search_files", pattern="7f3a")
    assert found.startswith("no matches")
    assert two.secret.read_text() == SECRET and (two.a / "hard.txt").exists()


async def test_device_files_and_fifos(driver: Driver, two: TwoSessions, tmp_path: Path) -> None:
    os.mkfifo(two.a / "pipe")
    os.mknod(two.a / "sock", 0o600 | stat.S_IFSOCK)
    whys = {"pipe": "is a named pipe", "sock": "is a socket", "zero": "is a device file"}
    try:
        os.mknod(two.a / "zero", 0o600 | stat.S_IFCHR, os.makedev(1, 5))  # /dev/zero's numbers
        devices = ["pipe", "sock", "zero"]
    except PermissionError:  # not root: no device file
        devices = ["pipe", "sock"]
    for path in devices:
        why = whys[path]
        for result in [
            await driver.call(ALICE, "s1", "read_file", path=path),
            await driver.call(ALICE, "s1", "write_file", path=path, content="x"),
            await driver.call(ALICE, "s1", "append_file", path=path, content="x"),
            await driver.call(ALICE, "s1", "delete_file", path=path),
        ]:
            assert result == f"Error: '{path}' {why}; file tools open regular files only"
    assert (two.a / "pipe").exists()
    found = await driver.call(ALICE, "s1", "search_files", pattern="x")
    assert f"{len(devices)} links, binary or special files were not searched" in found


async def test_dot_session_ids_stay_in_their_own_workspace(driver: Driver) -> None:
    # Ids of dots alone are refused before anything runs; ids full of dots are a workspace
    # of their own each (named by a hash of the key, never by the id itself).
    for refused in (".", ".."):
        with pytest.raises(InvalidSessionId):
            await driver.rt.chat(driver.agent, "go", session_id=refused, principal=ALICE)
    dotted = ("...a", ".a.", "a..")
    for sid in dotted:
        result = await driver.call(ALICE, sid, "write_file", path="f.txt", content=sid)
        assert result == f"wrote {len(sid)} bytes to 'f.txt'"
    assert await driver.call(ALICE, "plain", "list_files") == "[the workspace is empty]"
    for sid in dotted:
        assert await driver.call(ALICE, sid, "read_file", path="f.txt") == sid
        assert await driver.call(ALICE, sid, "list_files") == f"f.txt  ({len(sid)} bytes)"
        ws = driver.workspace(ALICE, sid)
        assert ws.parent.parent == driver.rt.workspace_root
        assert (ws / "f.txt").read_text() == sid
    assert await driver.call(BOB, "a..", "list_files") == "[the workspace is empty]"


# -- checks on the open descriptor: a swap between check and use ----------------------------


def _swap_after_check(monkeypatch: pytest.MonkeyPatch, swap: Callable[[], None]) -> None:
    """Run ``swap`` right after the tool has looked at the last component, before it opens it."""
    real = confined.lstat_in

    def looked(dir_fd: int, name: str) -> os.stat_result | None:
        seen = real(dir_fd, name)
        swap()
        return seen

    monkeypatch.setattr(ft, "lstat_in", looked)


@pytest.mark.parametrize("link", ["symlink", "hardlink"])
def test_a_link_swapped_in_after_the_check(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, link: str
) -> None:
    a, b = ensure_workspace(tmp_path / "a"), ensure_workspace(tmp_path / "b")
    secret = b / "secret.txt"
    secret.write_text(SECRET)
    ctx = _ctx(a)

    def swap() -> None:
        (a / "f.txt").unlink(missing_ok=True)
        if link == "symlink":
            (a / "f.txt").symlink_to(secret)
        else:
            os.link(secret, a / "f.txt")

    why = "is a symbolic link" if link == "symlink" else "has 2 hard links|changed while"
    calls: list[Callable[[], str]] = [
        lambda: read_file.function(ctx, "f.txt"),
        lambda: write_file.function(ctx, "f.txt", "pwned"),
        lambda: append_file.function(ctx, "f.txt", "pwned"),
    ]
    for fn in calls:
        (a / "f.txt").unlink(missing_ok=True)
        (a / "f.txt").write_text("mine")
        with monkeypatch.context() as m:
            _swap_after_check(m, swap)
            with pytest.raises(ToolError, match=why):
                fn()
        assert secret.read_text() == SECRET


# -- limits ----------------------------------------------------------------------------------


async def test_quota(tmp_path: Path) -> None:
    model = ScriptedModel()
    agent = Agent(name="files", model=model, tools=[*FILE_TOOLS], memory={"auto": False})
    async with Runtime(
        InMemoryStore(), data_dir=tmp_path, agents=[agent], workspace_quota=10_000
    ) as rt:
        d = Driver(rt, agent, model)
        assert "wrote" in await d.call(ALICE, "q", "write_file", path="a", content="x" * 6000)
        refused = await d.call(ALICE, "q", "write_file", path="b", content="y" * 6000)
        assert refused.startswith("Error: the workspace would hold") and "10,000" in refused
        refused = await d.call(ALICE, "q", "append_file", path="a", content="y" * 6000)
        assert "over its quota" in refused
        # Rewriting counts what the file grows by, not its whole new size.
        assert "wrote" in await d.call(ALICE, "q", "write_file", path="a", content="z" * 9000)
        assert not (d.workspace(ALICE, "q") / "b").exists()
        assert (d.workspace(ALICE, "q") / "a").read_text() == "z" * 9000
        # Another session has a quota of its own.
        assert "wrote" in await d.call(BOB, "q", "write_file", path="b", content="y" * 5000)


def test_one_write_is_capped(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path / "ws", quota=100 * WRITE_LIMIT_BYTES)
    too_big = "x" * (WRITE_LIMIT_BYTES + 1)
    for fn in (write_file.function, append_file.function):
        with pytest.raises(ToolError, match="more than one call may write"):
            fn(ctx, "big.txt", too_big)
    assert not (tmp_path / "ws" / "big.txt").exists()
    assert "wrote" in write_file.function(ctx, "big.txt", "x" * WRITE_LIMIT_BYTES)


def test_reads_are_capped_and_go_on_from_an_offset(tmp_path: Path) -> None:
    ws = ensure_workspace(tmp_path / "ws")
    ctx = _ctx(ws)
    line = "x" * 99 + "\n"  # 100 bytes
    count = (READ_LIMIT_BYTES // 100) * 3
    (ws / "big.txt").write_text(line * count)
    first = read_file.function(ctx, "big.txt")
    shown = READ_LIMIT_BYTES // 100 + 1  # the last line is cut by the byte cap
    assert len(first.encode()) < READ_LIMIT_BYTES + 300
    assert f"line {shown} is cut at the read limit of 256 KB" in first
    assert f"offset={shown + 1}" in first
    rest = read_file.function(ctx, "big.txt", offset=count - 1)
    assert rest == line * 2  # the end: no note
    some = read_file.function(ctx, "big.txt", offset=10, limit=3)
    assert (
        some
        == line * 3 + "[lines 10-12 shown; the file goes on: read_file with offset=13 for more]"
    )
    assert read_file.function(ctx, "big.txt", offset=count + 5) == (
        f"['big.txt' has {count} lines; there is no line {count + 5}]"
    )


def test_text_only(tmp_path: Path) -> None:
    ws = ensure_workspace(tmp_path / "ws")
    ctx = _ctx(ws)
    (ws / "img.png").write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR")
    with pytest.raises(ToolError, match=r"'img.png' looks binary"):
        read_file.function(ctx, "img.png")
    (ws / "latin1.txt").write_bytes("café\n".encode("latin-1"))
    text = read_file.function(ctx, "latin1.txt")
    assert text.startswith("caf\ufffd\n") and "not valid UTF-8" in text
    (ws / "empty.txt").write_text("")
    assert read_file.function(ctx, "empty.txt") == "['empty.txt' is empty]"
    (ws / "no-newline.txt").write_text("a\nb")
    assert read_file.function(ctx, "no-newline.txt") == "a\nb"
    assert read_file.function(ctx, "no-newline.txt", offset=3) == (
        "['no-newline.txt' has 2 lines; there is no line 3]"
    )
    with pytest.raises(ToolError, match="is a directory; list_files"):
        ensure_workspace(ws / "sub")
        read_file.function(ctx, "sub")
    with pytest.raises(ToolError, match=r"'mine.txt/x': 'mine.txt' is a file, not a directory"):
        (ws / "mine.txt").write_text("m")
        write_file.function(ctx, "mine.txt/x", "y")


def test_search_is_capped_and_checks_its_regex(tmp_path: Path) -> None:
    ws = ensure_workspace(tmp_path / "ws")
    ctx = _ctx(ws)
    (ws / "d").mkdir()
    (ws / "d" / "many.txt").write_text("needle\n" * (SEARCH_MATCH_LIMIT + 50))
    found = search_files.function(ctx, "needle", "d").splitlines()
    assert found[0] == "d/many.txt:1: needle"
    assert len(found) == SEARCH_MATCH_LIMIT + 1
    assert found[-1].startswith(f"[stopped at {SEARCH_MATCH_LIMIT} matches")
    with pytest.raises(ToolError, match="not a valid regular expression"):
        search_files.function(ctx, "(unclosed", regex=True)
    with pytest.raises(ToolError, match=r"'d/many.txt' is a file, not a directory"):
        search_files.function(ctx, "x", "d/many.txt")
    with pytest.raises(ToolError, match="is not empty"):
        delete_file.function(ctx, "d")


def test_a_search_told_to_stop_stops(tmp_path: Path) -> None:
    """A sync tool cannot be interrupted: past its timeout the search sees ``cancelled`` and
    returns what it found so far."""
    ws = ensure_workspace(tmp_path / "ws")
    (ws / "a.txt").write_text("needle\n")
    ctx = _ctx(ws)
    ctx.cancelled.set()
    assert search_files.function(ctx, "needle") == (
        "no matches for 'needle' in '.'\n[stopped: the search ran out of time]"
    )
