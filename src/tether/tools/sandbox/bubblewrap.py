"""bubblewrap (Debian ``bubblewrap``): namespaces and a read-only system around each call.

Inside: ``/usr`` (and the ``/bin``, ``/lib``… links to it) read-only, the few ``/etc`` files
programs need to find their libraries and Debian's alternatives, a fresh ``/proc`` of its own
pid namespace, a minimal ``/dev``, a private tmpfs ``/tmp``, and the session's workspace
read-write at ``/workspace`` (also the working directory and ``$HOME``); the root, ``/etc`` and
``/dev`` themselves are read-only. Nothing else of the host: no data dir, no other workspace,
no network interface but a loopback of its own (bwrap brings it up; nothing listens there), so
no egress and no DNS. rlimits are set by ``prlimit`` just before the command.

Running as root needs care: the kernel never applies RLIMIT_NPROC to uid 0, and a user
namespace does not help (its uid still maps to host uid 0), so a fork bomb would be unbounded.
As root bwrap therefore runs privileged (no user namespace) and the command drops to an
unprivileged host uid (the session's own, :meth:`Bubblewrap.uid_for`) with ``setpriv`` — no
capabilities, no new privileges — and the workspace is handed to that uid before each call.
As any other user, bwrap makes a user namespace as usual and the limits count within it.
"""

from __future__ import annotations

import logging
import os
import shutil
import signal
import subprocess
import tempfile
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Literal

import anyio.to_thread

from tether.tools import tree
from tether.tools.sandbox.base import Limits, Outcome, explain, rlimits
from tether.tools.sandbox.process import run_process

_PROVIDED = frozenset({"/usr", "/etc", "/proc", "/dev", "/tmp", "/workspace"})
"""Top directories the sandbox makes itself."""
_WHOLE = frozenset({"/usr", "/proc", "/dev", "/workspace"})
"""Top directories whose insides the sandbox has as they are: no directory is made in them."""
INSIDE = "/workspace"
"""Where the workspace appears inside the sandbox."""
NOBODY = 65534
SESSION_UIDS = (1_000_000_000, 100_000_000)
"""As root: the first uid and how many a workspace's own uid is taken from (by its hashed
name), so one session's processes never count against another's process limit and its files
are no other sandbox's. No passwd entry is needed; none of them is a user of the host."""
_SYSTEM_LINKS = ("bin", "sbin", "lib", "lib32", "lib64", "libx32")
_ETC = ("alternatives", "ld.so.cache", "ld.so.conf", "ld.so.conf.d", "localtime")
"""``/etc`` pieces shared read-only: library lookup, Debian's ``/usr/bin/x -> /etc/alternatives``
links (awk, which…), the time zone. No passwd, hosts, resolv.conf or certificates."""
_PATH = "/usr/local/bin:/usr/bin:/bin"
_PLAIN_PROBE = (
    *("--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts"),
    *("--ro-bind", "/", "/", "/bin/true"),
)
"""What the probe asks of bwrap when the sandbox's own command fails: the same namespaces and
nothing else of ours (a user namespace too when not root)."""
log = logging.getLogger("tether.sandbox")
_STAMP_MARGIN_NS = 1_000_000_000
"""Taken off a hand-over's stamp before it is compared: ctimes come from a clock that ticks
coarsely and may be stepped back a little."""
_STAMPS_KEPT = 4096
"""Workspaces whose last hand-over is remembered (the least recently used are forgotten)."""


@dataclass(frozen=True, slots=True)
class Probe:
    """What :meth:`Bubblewrap.probe` found."""

    problem: str | None = None
    """Why the sandbox cannot run here, a sentence for the operator; None when it can."""
    fault: Literal["missing", "host", "tether"] | None = None
    """``missing``: a program is not installed; ``host``: bwrap cannot make namespaces here at
    all; ``tether``: bwrap works, but refuses the sandbox's command (a bug of ours)."""


class Bubblewrap:
    """Runs each call in a fresh bubblewrap sandbox confined to one workspace."""

    name = "bubblewrap"

    def __init__(
        self,
        *,
        bwrap: str | None = None,
        uid: int | None = None,
        gid: int | None = None,
    ) -> None:
        self.bwrap = bwrap or shutil.which("bwrap") or "/usr/bin/bwrap"
        self.prlimit = shutil.which("prlimit") or "/usr/bin/prlimit"
        self.setpriv = shutil.which("setpriv") or "/usr/bin/setpriv"
        self.privileged = os.geteuid() == 0
        """Root: bwrap without a user namespace, the command dropped to ``uid``/``gid``."""
        self.uid = uid
        """As root, the host uid every sandboxed command runs as; None (the default): each
        workspace's own (:meth:`uid_for`). Without root, our own uid, always."""
        self.gid = gid
        self._probed: Probe | None = None
        # Hand-overs run on worker threads (command() is called off the event loop).
        self._stamps: OrderedDict[tuple[Path, int, int], int] = OrderedDict()
        self._stamps_lock = threading.Lock()

    def unavailable(self) -> str | None:
        return self.probe().problem

    def probe(self) -> Probe:
        """Whether the sandbox can run here, and if not whose fault it is (:class:`Probe`).

        Probed once per instance: what is installed does not change under a running server. A
        failure is logged once as a warning, since the model, not the operator, reads the
        tools' refusal.
        """
        if self._probed is None:
            self._probed = self._probe()
            if self._probed.problem is not None:
                log.warning("the bubblewrap sandbox cannot run: %s", self._probed.problem)
        return self._probed

    def _probe(self) -> Probe:
        needed = [self.bwrap, self.prlimit] + ([self.setpriv] if self.privileged else [])
        for program in needed:
            if not os.access(program, os.X_OK):
                return Probe(
                    f"{program} is missing (install the bubblewrap and util-linux packages, "
                    "e.g. apt-get install bubblewrap)",
                    "missing",
                )
        with tempfile.TemporaryDirectory(prefix="tether-sandbox-probe-") as tmp:
            probe = Path(tmp)
            if self.privileged:
                self._hand_over(probe, *self.uid_for(probe))
            failed = _failure(self.command(["/bin/true"], workspace=probe, limits=Limits()))
        if failed is None:
            return Probe()
        # Whose fault: bwrap asked plainly for the same namespaces tells a host that cannot
        # make them (user namespaces disabled, a container's seccomp) from a command of ours
        # that bwrap refuses.
        plain = [self.bwrap, *([] if self.privileged else ["--unshare-user"]), *_PLAIN_PROBE]
        if _failure(plain) is not None:
            return Probe(
                f"bubblewrap cannot make its namespaces here ({failed}); user namespaces may be "
                "disabled (sysctl user.max_user_namespaces, kernel.unprivileged_userns_clone) "
                "or forbidden by a container",
                "host",
            )
        return Probe(
            f"bubblewrap works here, but tether's sandbox command failed ({failed}): "
            "a bug in tether, please report it",
            "tether",
        )

    def command(
        self,
        argv: list[str],
        *,
        workspace: Path,
        limits: Limits,
        read_only: Sequence[Path] = (),
        env: Mapping[str, str] | None = None,
    ) -> list[str]:
        binds: list[str] = []
        made: set[Path] = set()
        for path in read_only:
            # The directories above it, made by bwrap as root, would be root's alone (0700):
            # the dropped uid could not reach what is bound below them.
            for parent in reversed(Path(path).parents):
                if parent not in made and not _provided(parent):
                    made.add(parent)
                    binds += ["--perms", "0755", "--dir", str(parent)]
            # At the same place inside, read-only; one that does not exist is left out.
            binds += ["--ro-bind-try", str(path), str(path)]
        variables: list[str] = []
        for name, value in (env or {}).items():
            variables += ["--setenv", name, value]
        uid, gid = self.uid_for(workspace)
        if self.privileged:
            self._hand_over(workspace, uid, gid)
        return [
            self.bwrap,
            *self._namespaces(),
            "--die-with-parent",
            # No --new-session: the caller starts bwrap in a session of its own
            # (start_new_session), so nothing inside has a controlling terminal to inject into,
            # and bwrap's pid-1 child stays in bwrap's process group. One SIGKILL to the group
            # then reaches that pid 1, whose death takes the whole pid namespace with it. With
            # --new-session the child led a group of its own and died only by bwrap's
            # parent-death signal, which under load now and then never came (a leak the kill
            # tests caught).
            *self._filesystem(workspace, limits),
            *binds,
            # Last, once everything below is made: bwrap's own tmpfs root (with /etc in it) and
            # /dev read-only. As a non-root user they are the caller's, so the command could
            # otherwise write there, into memory without a bound; as root they are root's,
            # and this is a second lock. /tmp, the workspace and the device nodes are mounts of
            # their own and stay writable.
            *("--remount-ro", "/", "--remount-ro", "/dev"),
            "--clearenv",
            *_env(),
            *variables,
            "--",
            *self._drop(uid, gid),
            *rlimits(self.prlimit, limits),
            *argv,
        ]

    async def run(
        self,
        argv: list[str],
        *,
        workspace: Path,
        limits: Limits,
        stdin: bytes | None = None,
    ) -> Outcome:
        full = await anyio.to_thread.run_sync(
            lambda: self.command(argv, workspace=workspace, limits=limits)
        )
        outcome = await run_process(full, limits=limits, env={"PATH": _PATH}, stdin=stdin)
        if outcome.signal is None and outcome.exit_status > 128:
            # bwrap's pid 1 reports a child killed by signal N as 128+N.
            number = outcome.exit_status - 128
            if number in signal.valid_signals():
                outcome = replace(outcome, signal=number)
        return explain(outcome, limits)

    def _namespaces(self) -> list[str]:
        common = ["--unshare-net", "--unshare-pid", "--unshare-ipc", "--unshare-uts"]
        common += ["--unshare-cgroup-try", "--hostname", "sandbox"]
        if self.privileged:
            # Only the two capabilities setpriv needs to drop to the sandbox uid; setpriv
            # then clears every set, the bounding set included, and forbids regaining any.
            return [*common, "--cap-add", "CAP_SETUID", "--cap-add", "CAP_SETGID"]
        return [*common, "--unshare-user", "--disable-userns"]

    def _filesystem(self, workspace: Path, limits: Limits) -> list[str]:
        args = ["--ro-bind", "/usr", "/usr"]
        for name in _SYSTEM_LINKS:
            host = Path("/", name)
            if host.is_symlink():
                args += ["--symlink", os.readlink(host), str(host)]
            elif host.is_dir():
                args += ["--ro-bind", str(host), str(host)]
        # Made by bwrap as root, these would be 0700 root's; the dropped uid must read /etc
        # and write /tmp.
        args += ["--perms", "0755", "--dir", "/etc"]
        for name in _ETC:
            args += ["--ro-bind-try", f"/etc/{name}", f"/etc/{name}"]
        args += ["--proc", "/proc", "--dev", "/dev"]
        args += ["--size", str(limits.tmp_bytes), "--perms", "1777", "--tmpfs", "/tmp"]
        args += ["--bind", str(workspace), INSIDE, "--chdir", INSIDE]
        return args

    def uid_for(self, workspace: Path) -> tuple[int, int]:
        """The uid and gid a command in ``workspace`` runs as, when tether runs as root: the
        given ones, else the workspace's own, taken from its hashed name (``nobody`` for a
        directory not named so, the probe's)."""
        if self.uid is not None:
            return self.uid, self.gid if self.gid is not None else self.uid
        try:
            n = int(workspace.name, 16)
        except ValueError:
            return NOBODY, NOBODY
        first, span = SESSION_UIDS
        own = first + n % span
        return own, own

    def _drop(self, uid: int, gid: int) -> list[str]:
        if not self.privileged:
            return []
        return [
            self.setpriv,
            f"--reuid={uid}",
            f"--regid={gid}",
            "--clear-groups",
            "--inh-caps=-all",
            "--bounding-set=-all",
            "--no-new-privs",
        ]

    def _hand_over(self, workspace: Path, uid: int, gid: int) -> None:
        """Make the workspace the sandbox uid's, so the dropped command can write in it.

        Walked by file descriptor with ``O_NOFOLLOW | O_NONBLOCK`` (:func:`.tree.chown_all`):
        a sandboxed server may be changing the tree meanwhile, and a directory swapped for a
        link or a FIFO must neither lead out nor hang us (``os.fwalk`` opened it plainly). Links
        are changed themselves, and a file with more than one name is left alone, since another
        name may be outside the workspace.

        Each call after the first looks only where something may have come in since the last
        (directories whose ctime moved, :func:`.tree.chown_all`'s stamp): a workspace of a
        thousand files took ~3.5 ms to walk whole before every call. The stamp is kept here,
        per process; a process that has none walks the whole tree once.
        """
        at = (workspace, uid, gid)
        with self._stamps_lock:
            since = self._stamps.get(at)
        stamp = tree.chown_all(
            workspace,
            uid,
            gid,
            unchanged_before=None if since is None else since - _STAMP_MARGIN_NS,
        )
        with self._stamps_lock:
            if stamp is None:
                self._stamps.pop(at, None)
                return
            self._stamps[at] = stamp
            self._stamps.move_to_end(at)
            while len(self._stamps) > _STAMPS_KEPT:
                self._stamps.popitem(last=False)


def _provided(path: Path) -> bool:
    """Whether the sandbox has the directory ``path`` already, or must not get it made:
    ``/``, its own top directories, everything below ``/usr`` (bound whole) and below
    ``/proc``, ``/dev`` and ``/workspace``. Below ``/tmp`` or ``/etc`` (made empty) a parent is
    made (``/tmp/ci/.venv`` needs ``/tmp/ci``)."""
    if path == Path("/") or str(path) in _PROVIDED:
        return True
    top = Path(*path.parts[:2])
    return str(top) in _WHOLE or top.is_symlink()


def _env() -> list[str]:
    values = {
        "PATH": _PATH,
        "HOME": INSIDE,
        "LANG": "C.UTF-8",
        "TMPDIR": "/tmp",
        "PYTHONDONTWRITEBYTECODE": "1",
    }
    args: list[str] = []
    for name, value in values.items():
        args += ["--setenv", name, value]
    return args


def _failure(argv: list[str]) -> str | None:
    """Run ``argv`` to its end; how it failed, in words, or None when it exited 0."""
    try:
        done = subprocess.run(argv, capture_output=True, timeout=30, check=False)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"it could not start: {exc}"
    if done.returncode == 0:
        return None
    said = done.stderr.decode("utf-8", errors="replace").strip()
    return f"exit status {done.returncode}: {said}"
