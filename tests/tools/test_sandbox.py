"""Sandboxed code and shell: no network, only the workspace writable, rlimits, a killed tree.

These run real bubblewrap; they skip (saying how to enable them) where it is missing or cannot
make its namespaces, and fail where it runs but refuses our command (tests/tools/conftest.py).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import socket
import time
from collections.abc import AsyncIterator, Iterator
from pathlib import Path

import pytest

from tests.helpers import wait_until
from tests.tools.conftest import gate
from tether import Agent
from tether.errors import ToolError
from tether.records import LOCAL_PRINCIPAL, SessionKey
from tether.runtime import Runtime
from tether.store import InMemoryStore
from tether.testing import Call, ScriptedModel, ToolCalls
from tether.tools import Tool, ToolContext
from tether.tools.sandbox import Bubblewrap, Limits, sandbox_tools
from tether.tools.sandbox.base import Outcome, explain
from tether.tools.sandbox.process import run_process
from tether.tools.workspace import ensure_workspace, workspace_dir

_BWRAP = Bubblewrap()
needs_bwrap = pytest.mark.usefixtures("bubblewrap")  # tests/tools/conftest.py: skip or fail
LIMITS = Limits(wall_seconds=20, processes=32)


def _ctx(root: Path, session_id: str) -> ToolContext:
    key = SessionKey(LOCAL_PRINCIPAL.tenant, LOCAL_PRINCIPAL.user, session_id)
    return ToolContext(
        session=key,
        principal=LOCAL_PRINCIPAL,
        turn_id="t",
        call_id="c",
        cancelled=asyncio.Event(),
        workspace=workspace_dir(root, key),
    )


def _tools(limits: Limits = LIMITS, sandbox: Bubblewrap | str = _BWRAP) -> dict[str, Tool]:
    made = sandbox_tools(sandbox, limits=limits, requires_approval=False)  # type: ignore[arg-type]
    return {t.name: t for t in made}


async def _shell(ctx: ToolContext, command: str, limits: Limits = LIMITS) -> str:
    return await _tools(limits)["shell"].invoke(json.dumps({"command": command}), ctx)


async def _python(ctx: ToolContext, code: str, limits: Limits = LIMITS) -> str:
    return await _tools(limits)["run_python"].invoke(json.dumps({"code": code}), ctx)


def _marker(number: str) -> str:
    """A ``sleep`` argument no other run's processes have: ``number.<this pid>`` (sleep takes a
    fraction), so a process another run left behind cannot fail this one, nor hide in it."""
    return f"{number}.{os.getpid()}"


def _live_pids_with(marker: str) -> set[int]:
    """Host pids of live processes whose command line holds ``marker`` (zombies have none)."""
    found: set[int] = set()
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            cmdline = Path("/proc", entry, "cmdline").read_bytes()
        except OSError:
            continue
        if marker.encode() in cmdline:
            found.add(int(entry))
    return found


def _sleeps(marker: str) -> set[int]:
    """The live ``sleep <marker>`` processes themselves (not the shell or bwrap naming them)."""
    return {
        pid
        for pid in _live_pids_with(marker)
        if _cmdline(pid).startswith(f"sleep\0{marker}".encode())
    }


def _cmdline(pid: int) -> bytes:
    try:
        return Path("/proc", str(pid), "cmdline").read_bytes()
    except OSError:
        return b""


@pytest.fixture
async def listener() -> AsyncIterator[int]:
    async def serve(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        writer.close()

    server = await asyncio.start_server(serve, "127.0.0.1", 0)
    try:
        yield server.sockets[0].getsockname()[1]
    finally:
        server.close()
        await server.wait_closed()


@needs_bwrap
async def test_no_interface_but_its_own_loopback_and_no_connection_to_the_hosts_listener(
    tmp_path: Path, listener: int
) -> None:
    ctx = _ctx(tmp_path, "s")
    # The listener is reachable from outside, so a failure inside is the sandbox's doing.
    _, writer = await asyncio.open_connection("127.0.0.1", listener)
    writer.close()
    code = f"import socket\nsocket.create_connection(('127.0.0.1', {listener}), timeout=5)\n"
    out = await _python(ctx, code)
    assert out.startswith("exit status: 1\n")
    assert "ConnectionRefusedError" in out or "OSError" in out
    out = await _shell(ctx, "tail -n +3 /proc/net/dev | cut -d: -f1 | tr -d ' '")
    assert out == "exit status: 0\nstdout:\nlo\n"


_RESOLVER = "127.53.0.1"
"""A loopback address nothing else on the host uses: the DNS test's resolver listens there."""


@pytest.fixture
def resolver() -> Iterator[socket.socket]:
    """A UDP socket on port 53 of :data:`_RESOLVER` that answers nothing: the test only looks
    at what arrives (resolv.conf has no port, so it must be 53)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        sock.bind((_RESOLVER, 53))
    except PermissionError:
        sock.close()
        pytest.skip("the DNS test listens on port 53, which needs root (or CAP_NET_BIND_SERVICE)")
    sock.setblocking(False)
    try:
        yield sock
    finally:
        sock.close()


def _queries(sock: socket.socket) -> list[bytes]:
    """The datagrams that reached ``sock`` so far."""
    got = []
    with contextlib.suppress(BlockingIOError):
        while True:
            got.append(sock.recv(4096))
    return got


@needs_bwrap
async def test_dns_fails_and_no_query_leaves_the_sandbox(
    tmp_path: Path, resolver: socket.socket
) -> None:
    """The sandbox has no resolv.conf, which alone would fail a lookup; here it gets one naming
    a resolver on the host's loopback, so only the network namespace stands in the way. The
    same run without ``--unshare-net`` shows the query would arrive."""
    conf = tmp_path / "resolv.conf"
    conf.write_text(f"nameserver {_RESOLVER}\noptions timeout:1 attempts:1\n")
    workspace = ensure_workspace(tmp_path / "ws")

    def getent(*, network_namespace: bool) -> list[str]:
        argv = _BWRAP.command(
            ["getent", "hosts", "example.com"], workspace=workspace, limits=LIMITS
        )
        at = argv.index("--remount-ro")  # before / is made read-only
        argv[at:at] = ["--ro-bind", str(conf), "/etc/resolv.conf"]
        return argv if network_namespace else [a for a in argv if a != "--unshare-net"]

    outcome = await run_process(getent(network_namespace=True), limits=LIMITS)
    assert outcome.exit_status == 2, outcome.render()  # getent: not found
    assert _queries(resolver) == []

    outcome = await run_process(getent(network_namespace=False), limits=LIMITS)
    assert outcome.exit_status == 2, outcome.render()  # no answer came
    assert any(b"\x07example\x03com\x00" in q for q in _queries(resolver))


@needs_bwrap
async def test_only_the_workspace_is_writable(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    (data_dir / "secret").mkdir(parents=True)
    ctx = _ctx(data_dir / "workspaces", "s")
    targets = ["/usr/x", "/etc/x", "/x", f"{data_dir}/x", f"{data_dir}/secret/x"]
    script = "".join(f"touch {t} 2>/dev/null && echo WROTE {t}; " for t in targets)
    out = await _shell(ctx, script + "echo in-workspace > mine.txt && echo ok")
    assert "WROTE" not in out
    assert "ok" in out
    assert ctx.workspace is not None
    assert (ctx.workspace / "mine.txt").read_text() == "in-workspace\n"
    assert not [t for t in targets if os.path.exists(t)]  # noqa: ASYNC240 - a quick local look
    out = await _shell(ctx, f"ls {data_dir}; echo ls=$?; touch /tmp/scratch && echo tmp-ok")
    assert "ls=0" not in out and "tmp-ok" in out


_MOUNTS = "for line in open('/proc/self/mountinfo'):\n    f = line.split()\n    print(f[4], f[5])\n"
"""Each mount inside: its place and its own options (``ro``/``rw`` first)."""


@needs_bwrap
async def test_only_the_workspace_tmp_and_devices_are_mounted_writable(tmp_path: Path) -> None:
    """Read from the mount table, not by trying to write: the dropped uid may not write to
    root-owned ``/usr`` whatever the mount says, so a writable bind would pass a write test."""
    out = await _python(_ctx(tmp_path, "s"), _MOUNTS)
    assert out.startswith("exit status: 0\nstdout:\n"), out
    mounts = dict(line.split() for line in out.split("stdout:\n")[1].splitlines())
    writable = {place for place, options in mounts.items() if options.split(",")[0] == "rw"}
    # /proc is the kernel's (its own sysctls refuse a dropped uid), /dev/* are device nodes.
    assert {"/workspace", "/tmp"} <= writable
    assert not {
        p
        for p in writable
        if p not in ("/workspace", "/tmp", "/proc") and not p.startswith("/dev/")
    }
    for place in ("/", "/usr", "/dev", "/etc/ld.so.cache"):
        assert mounts[place].startswith("ro,"), (place, mounts[place])


@needs_bwrap
async def test_the_sandbox_has_namespaces_of_its_own(tmp_path: Path) -> None:
    kinds = ["ipc", "uts", "pid", "net", "mnt"] + ([] if os.geteuid() == 0 else ["user"])
    code = f"import os\nfor k in {kinds!r}:\n    print(k, os.readlink(f'/proc/self/ns/{{k}}'))\n"
    out = await _python(_ctx(tmp_path, "s"), code)
    assert out.startswith("exit status: 0\nstdout:\n"), out
    inside = dict(line.split() for line in out.split("stdout:\n")[1].splitlines())
    assert set(inside) == set(kinds)
    same = [k for k in kinds if inside[k] == os.readlink(f"/proc/self/ns/{k}")]
    assert same == []


@needs_bwrap
async def test_proc_shows_only_the_sandboxs_processes(tmp_path: Path) -> None:
    code = (
        "import os\n"
        "pids = [p for p in os.listdir('/proc') if p.isdigit()]\n"
        "names = sorted(open(f'/proc/{p}/comm').read().strip() for p in pids)\n"
        "print(len(pids), names)\n"
    )
    out = await _python(_ctx(tmp_path, "s"), code)
    # bwrap's pid 1 and the program itself (prlimit exec'd it), whatever runs on the host.
    assert out == "exit status: 0\nstdout:\n2 ['bwrap', 'python3']\n"


@needs_bwrap
async def test_a_session_cannot_reach_another_sessions_workspace(tmp_path: Path) -> None:
    root = tmp_path / "workspaces"
    a, b = _ctx(root, "a"), _ctx(root, "b")
    assert b.workspace is not None
    assert "exit status: 0" in await _shell(b, "echo CONTENT-OF-B > secret.txt")
    assert (b.workspace / "secret.txt").exists()
    out = await _shell(
        a,
        f"ls {b.workspace}; echo ls=$?; cat {b.workspace}/secret.txt; ls {root}; echo root=$?; "
        "ls -a /workspace",
    )
    assert "CONTENT-OF-B" not in out
    # Neither B's workspace nor the root above it exists in A's sandbox; A's own is empty.
    assert "stdout:\nls=2\nroot=2\n.\n..\n\nstderr:" in out
    assert "ls=0" not in out and "root=0" not in out


@needs_bwrap
async def test_a_fork_bomb_stops_at_the_process_limit(tmp_path: Path) -> None:
    code = (
        "import os, time\n"
        "n = 0\n"
        "try:\n"
        "    while True:\n"
        "        if os.fork() == 0:\n"
        "            time.sleep(60); os._exit(0)\n"
        "        n += 1\n"
        "except OSError as exc:\n"
        "    print('forked', n, 'then', exc, flush=True)\n"
        "    raise SystemExit('Cannot fork')\n"
    )
    out = await _python(_ctx(tmp_path, "s"), code)
    assert "Resource temporarily unavailable" in out
    forked = int(out.split("forked ")[1].split()[0])
    assert forked < LIMITS.processes
    assert "limit: probably the process limit (32 processes)" in out
    # The classic one too, as the model would type it: it ends, and says why.
    out = await _shell(_ctx(tmp_path, "s"), ":(){ :|:& };:; sleep 1")
    assert "process limit" in out


def test_a_fork_bombs_dying_forks_are_told_as_the_process_limit_not_memory() -> None:
    """Once a fork bomb's first shell is gone, the forks still under way in its pid namespace
    fail with ENOMEM: what the shell prints then (seen in CI) names the process limit, which
    is what was hit; ENOMEM alone is the memory limit."""
    bomb = (
        b"environment: fork: retry: Resource temporarily unavailable\n"
        b"environment: fork: Cannot allocate memory\n"
    )
    told = explain(Outcome(0, stderr=bomb), LIMITS).reason
    assert told == "probably the process limit (32 processes)"
    hog = explain(Outcome(1, stderr=b"MemoryError\n"), LIMITS).reason
    assert hog is not None and hog.startswith("probably the memory limit")
    alone = explain(Outcome(1, stderr=b"fork: Cannot allocate memory\n"), LIMITS).reason
    assert alone is not None and alone.startswith("probably the memory limit")


@needs_bwrap
async def test_a_memory_hog_hits_the_address_space_limit(tmp_path: Path) -> None:
    limits = Limits(wall_seconds=20, memory_bytes=512 * 1024 * 1024)
    out = await _python(_ctx(tmp_path, "s"), "x = bytearray(1024 ** 3)\n", limits)
    assert out.startswith("exit status: 1\n")
    assert "MemoryError" in out and "memory limit" in out


@needs_bwrap
@pytest.mark.parametrize("tool", ["run_python", "shell"])
async def test_a_cpu_hog_hits_the_cpu_limit_and_the_result_says_so(
    tmp_path: Path, tool: str
) -> None:
    # Well inside the wall limit: the CPU limit, not the wall, must end it.
    limits = Limits(wall_seconds=15, cpu_seconds=1)
    ctx = _ctx(tmp_path, "s")
    if tool == "run_python":
        out = await _python(ctx, "print('spinning', flush=True)\nwhile True: pass\n", limits)
    else:
        out = await _shell(ctx, "echo spinning; while :; do :; done", limits)
    # SIGXCPU at the soft limit (the hard one, a second later, would be an unexplained SIGKILL).
    assert out.startswith("exit status: 152 (killed by SIGXCPU)\n"), out
    assert "limit: the CPU time limit of 1 s per process was reached" in out
    assert "spinning" in out


@needs_bwrap
@pytest.mark.parametrize("tool", ["run_python", "shell"])
async def test_a_file_past_the_file_size_limit_is_cut_and_the_result_says_so(
    tmp_path: Path, tool: str
) -> None:
    limits = Limits(wall_seconds=15, file_bytes=100_000)
    ctx = _ctx(tmp_path, "s")
    if tool == "run_python":
        # Python ignores SIGXFSZ: its write fails with EFBIG instead.
        out = await _python(ctx, "open('big', 'wb').write(b'x' * 2_000_000)\n", limits)
        assert out.startswith("exit status: 1\n") and "File too large" in out
    else:
        out = await _shell(ctx, "head -c 2000000 /dev/zero > big", limits)
        assert out.startswith("exit status: 153 (killed by SIGXFSZ)\n"), out
    assert "limit: the file size limit of 100,000 bytes was reached" in out
    assert ctx.workspace is not None
    assert (ctx.workspace / "big").stat().st_size == 100_000


@needs_bwrap
async def test_opening_too_many_files_hits_the_open_files_limit_and_the_result_says_so(
    tmp_path: Path,
) -> None:
    code = (
        "kept = []\n"
        "try:\n"
        "    while len(kept) < 5000:\n"
        "        kept.append(open('/dev/null'))\n"
        "finally:\n"
        "    print('opened', len(kept), flush=True)\n"
    )
    out = await _python(_ctx(tmp_path, "s"), code, Limits(wall_seconds=15, open_files=50))
    assert out.startswith("exit status: 1\n") and "Too many open files" in out
    # stdin, stdout, stderr and whatever Python holds open count too.
    assert int(out.split("opened ")[1].split()[0]) < 50
    assert "limit: the open files limit (50) was reached" in out


@needs_bwrap
async def test_an_infinite_loop_ends_at_the_wall_limit(tmp_path: Path) -> None:
    limits = Limits(wall_seconds=1)
    started = time.monotonic()
    out = await _shell(_ctx(tmp_path, "s"), "echo before; while :; do :; done", limits)
    assert time.monotonic() - started < 10
    assert out.startswith("exit status: 137 (killed by SIGKILL)\n")
    assert "wall-clock limit of 1 s" in out and "before" in out


@needs_bwrap
async def test_the_wall_limit_kills_the_shells_background_jobs_too(tmp_path: Path) -> None:
    marker = _marker("987655")
    # A background job, one that left the session, and a foreground loop the limit ends. The
    # jobs let go of the output pipes, so one that survived is seen here by its pid (holding
    # them, it would keep the call from returning at all).
    quiet = ">/dev/null 2>&1"
    command = f"sleep {marker} {quiet} & setsid sleep {marker} {quiet} & while :; do :; done"
    call = asyncio.create_task(_shell(_ctx(tmp_path, "s"), command, Limits(wall_seconds=2)))
    await wait_until(lambda: len(_sleeps(marker)) == 2, within=20)  # both jobs run
    pids = _live_pids_with(marker)
    out = await call
    assert out.startswith("exit status: 137 (killed by SIGKILL)\n")
    assert "wall-clock limit of 2 s" in out
    await _all_gone_within_a_second(marker, pids)


@needs_bwrap
async def test_output_is_cut_with_a_marker(tmp_path: Path) -> None:
    limits = Limits(wall_seconds=20, output_bytes=1000)
    out = await _shell(_ctx(tmp_path, "s"), "head -c 300000 /dev/zero | tr '\\0' y", limits)
    assert out.startswith("exit status: 0\n")
    assert "output truncated: 300,000 bytes written, the first 1,000 shown" in out
    assert out.count("y") < 1100


async def _assert_tree_dies(start: asyncio.Task[str], marker: str, stop: object) -> None:
    await wait_until(lambda: len(_live_pids_with(marker)) >= 2, within=20)
    pids = _live_pids_with(marker)
    if stop is None:
        start.cancel()
    else:
        assert isinstance(stop, asyncio.Event)
        stop.set()
    await _all_gone_within_a_second(marker, pids)
    with pytest.raises((asyncio.CancelledError, ToolError)):
        await start


async def _all_gone_within_a_second(
    marker: str, pids: set[int], since: float | None = None
) -> None:
    """No process with ``marker`` alive a second after ``since`` (a ``time.monotonic()`` of
    when the stop was asked for; now, by default)."""
    deadline = (time.monotonic() if since is None else since) + 1.0
    try:
        # Looked at once even when the second is already over.
        await wait_until(
            lambda: not _live_pids_with(marker), within=max(deadline - time.monotonic(), 0.001)
        )
    except TimeoutError:
        left = _live_pids_with(marker)
        raise AssertionError(f"still alive a second later: {left} of {pids}") from None


@needs_bwrap
async def test_cancelling_the_call_kills_the_whole_tree(tmp_path: Path) -> None:
    marker = _marker("987651")
    # A background job, one that left the session, and the foreground one.
    command = f"sleep {marker} & setsid sleep {marker} & sleep {marker}"
    task = asyncio.create_task(_shell(_ctx(tmp_path, "s"), command))
    await _assert_tree_dies(task, marker, None)


@needs_bwrap
async def test_the_context_being_cancelled_kills_the_whole_tree(tmp_path: Path) -> None:
    marker = _marker("987652")
    ctx = _ctx(tmp_path, "s")
    task = asyncio.create_task(_shell(ctx, f"sleep {marker} & sleep {marker}"))
    await _assert_tree_dies(task, marker, ctx.cancelled)


@needs_bwrap
async def test_a_cancel_at_any_moment_of_the_start_leaves_nothing(tmp_path: Path) -> None:
    """Cancelled while bwrap is still being started (its pipes connected, its sandbox's pid 1
    forked), the call must still kill the whole group: asyncio alone kills bwrap, not the pid 1
    it has already made, and that one lives on."""
    marker = _marker("987654")
    workspace = ensure_workspace(tmp_path / "ws")
    for step in range(25):
        run = asyncio.create_task(
            _BWRAP.run(
                ["bash", "-c", f"sleep {marker} & sleep {marker}"],
                workspace=workspace,
                limits=LIMITS,
            )
        )
        await asyncio.sleep(step * 0.002)
        run.cancel()
        with pytest.raises(asyncio.CancelledError):
            await run
        await _all_gone_within_a_second(marker, _live_pids_with(marker))


@needs_bwrap
async def test_cancelling_the_turn_kills_the_shells_tree(tmp_path: Path) -> None:
    marker = _marker("987653")
    command = f"sleep {marker} & sleep {marker}"
    model = ScriptedModel(ToolCalls(Call("shell", {"command": command})))
    agent = Agent(name="a", model=model, tools=list(_tools().values()))
    rt = Runtime(InMemoryStore(), agents=[agent], data_dir=tmp_path)
    await rt.start()
    try:
        turn = await rt.submit(agent, "go", session_id="s")
        await wait_until(lambda: len(_live_pids_with(marker)) >= 2, within=20)
        pids = _live_pids_with(marker)
        # The second runs from the request, watched while cancel() is still under way (it
        # returns once the turn has ended, when the tree is long gone).
        asked = time.monotonic()
        cancelling = asyncio.create_task(rt.scheduler.cancel(turn.key, turn.id))
        await _all_gone_within_a_second(marker, pids, since=asked)
        done = await cancelling
        assert done.status == "cancelled"
    finally:
        await rt.close(drain_timeout=5)


async def test_no_sandbox_means_a_clear_refusal(tmp_path: Path) -> None:
    missing = Bubblewrap(bwrap=str(tmp_path / "no-bwrap"))
    shell = _tools(sandbox=missing)["shell"]
    with pytest.raises(ToolError, match=r"no sandbox is available.*apt-get install bubblewrap"):
        await shell.invoke(json.dumps({"command": "touch ran"}), _ctx(tmp_path, "s"))
    assert not list(tmp_path.rglob("ran"))  # noqa: ASYNC240 - a quick local look


class _Broken(Bubblewrap):
    """The sandbox's command with a flag gone (``--hostname`` stays, which bwrap then refuses),
    as a careless change would leave it."""

    def _namespaces(self) -> list[str]:
        return [a for a in super()._namespaces() if a != "--unshare-uts"]


@needs_bwrap
def test_a_command_bwrap_refuses_fails_the_tests_instead_of_skipping_them(
    caplog: pytest.LogCaptureFixture,
) -> None:
    with caplog.at_level(logging.WARNING, logger="tether.sandbox"):
        probe = _Broken().probe()
    assert probe.fault == "tether"
    assert probe.problem is not None
    assert probe.problem.startswith("bubblewrap works here, but tether's sandbox command failed")
    assert "--hostname" in probe.problem  # what bwrap said
    assert "a bug in tether" in probe.problem
    assert probe.problem in caplog.text  # the operator is told, not only the model
    for ci in (False, True):
        with pytest.raises(pytest.fail.Exception, match="the sandbox is broken"):
            gate(probe, ci=ci)


def test_a_host_without_namespaces_or_bwrap_skips_the_tests_except_on_ci(tmp_path: Path) -> None:
    # A bwrap that fails whatever it is asked, as one does where user namespaces are disabled.
    fake = tmp_path / "bwrap"
    fake.write_text("#!/bin/sh\necho 'bwrap: No permissions to create new namespace' >&2\nexit 1\n")
    fake.chmod(0o755)
    host = Bubblewrap(bwrap=str(fake)).probe()
    assert host.fault == "host"
    assert host.problem is not None
    assert "cannot make its namespaces here" in host.problem
    assert "No permissions to create new namespace" in host.problem
    missing = Bubblewrap(bwrap=str(tmp_path / "no-bwrap")).probe()
    assert missing.fault == "missing"
    assert missing.problem is not None and "apt-get install bubblewrap" in missing.problem
    for probe in (host, missing):
        with pytest.raises(pytest.skip.Exception, match="sandbox tests skipped"):
            gate(probe, ci=False)
        with pytest.raises(pytest.fail.Exception, match="CI must run the sandbox tests"):
            gate(probe, ci=True)


async def test_sandbox_none_runs_unconfined_and_warns(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    with caplog.at_level(logging.WARNING, logger="tether.sandbox"):
        tools = _tools(sandbox="none")
    assert "UNSANDBOXED" in caplog.text
    ctx = _ctx(tmp_path, "s")
    out = await tools["shell"].invoke(json.dumps({"command": "echo hi > f; cat f"}), ctx)
    assert out == "exit status: 0\nstdout:\nhi\n"
    assert ctx.workspace is not None and (ctx.workspace / "f").exists()


async def test_the_tools_ask_for_approval_by_default() -> None:
    assert all(t.requires_approval for t in sandbox_tools(_BWRAP))


async def test_a_workspace_over_its_quota_is_reported(tmp_path: Path) -> None:
    ctx = _ctx(tmp_path, "s")
    assert ctx.workspace is not None
    ensure_workspace(ctx.workspace)
    small = ToolContext(
        session=ctx.session,
        principal=ctx.principal,
        turn_id="t",
        call_id="c",
        cancelled=asyncio.Event(),
        workspace=ctx.workspace,
        workspace_quota=100,
    )
    out = await _tools(sandbox="none")["shell"].invoke(
        json.dumps({"command": "head -c 1000 /dev/zero > big"}), small
    )
    assert "over its quota of 100 bytes" in out


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="without root every sandbox runs as our own uid")
async def test_as_root_each_session_runs_as_a_uid_of_its_own(tmp_path: Path) -> None:
    """One session's fork bomb (or its MCP servers' threads) must not use up another's
    process limit, nor its files be the other's: as root, a uid per workspace."""
    uids = {}
    for sid in ("one", "two"):
        out = await _shell(_ctx(tmp_path, sid), "id -u")
        uids[sid] = int(out.split("stdout:\n")[1].split()[0])
    assert uids["one"] != uids["two"]
    assert all(u >= 1_000_000_000 for u in uids.values())
    # The same session gets the same uid again (its files stay its own).
    again = await _shell(_ctx(tmp_path, "one"), "id -u")
    assert int(again.split("stdout:\n")[1].split()[0]) == uids["one"]


@needs_bwrap
@pytest.mark.skipif(os.geteuid() != 0, reason="without root there is nothing to hand over")
async def test_what_tether_writes_between_calls_is_the_sandboxs_to_change(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """As root, files tether writes (its file tools, any tool given the workspace) are root's
    until the next call hands them to the session's uid; later calls look only into the
    directories that changed since (the stamp: no margin here, so no waiting a second)."""
    monkeypatch.setattr("tether.tools.sandbox.bubblewrap._STAMP_MARGIN_NS", 0)
    shell = _tools(sandbox=Bubblewrap())["shell"]  # a sandbox of its own: no stamps yet
    ctx = _ctx(tmp_path, "s")
    assert ctx.workspace is not None
    ws = ctx.workspace

    async def run(command: str) -> str:
        return await shell.invoke(json.dumps({"command": command}), ctx)

    assert "exit status: 0" in await run("mkdir -p notes/deep quiet && echo x > quiet/q.txt")
    assert "exit status: 0" in await run("true")  # a stamp newer than those directories
    await asyncio.sleep(0.05)  # the filesystem's clock ticks coarsely: past that stamp
    (ws / "notes" / "todo.txt").write_text("tether's\n")
    (ws / "notes" / "deep" / "new").mkdir()
    (ws / "notes" / "deep" / "new" / "x.txt").write_text("tether's\n")
    assert (ws / "notes" / "todo.txt").stat().st_uid == 0
    out = await run(
        "echo more >> notes/todo.txt && echo more >> notes/deep/new/x.txt && "
        "touch notes/deep/new/y && echo more >> quiet/q.txt && echo ok"
    )
    assert out == "exit status: 0\nstdout:\nok\n", out
    assert (ws / "notes" / "deep" / "new" / "x.txt").read_text() == "tether's\nmore\n"
