"""The gate of the sandbox tests (``needs_bwrap``: the ``bubblewrap`` fixture).

No bwrap installed, or a host that cannot make namespaces at all: the tests skip, saying how
to enable them, except with ``CI`` set, where they fail (as the PostgreSQL tests do,
``.ci/with-postgres``). A bwrap that runs but refuses the sandbox's own command is a bug of
ours: the tests fail wherever they run, rather than skip and leave the run green.
"""

from __future__ import annotations

import os

import pytest

from tether.tools.sandbox import Bubblewrap
from tether.tools.sandbox.bubblewrap import Probe

_BWRAP = Bubblewrap()


def gate(probe: Probe, ci: bool) -> None:
    """Skip or fail a sandbox test as ``probe`` says (nothing when the sandbox works)."""
    if probe.problem is None:
        return
    if probe.fault == "tether":
        pytest.fail(f"the sandbox is broken: {probe.problem}")
    if ci:
        pytest.fail(f"CI must run the sandbox tests, but {probe.problem}")
    pytest.skip(f"sandbox tests skipped: {probe.problem}")


@pytest.fixture
def bubblewrap() -> Bubblewrap:
    """A working bubblewrap sandbox, or the test skips or fails (see the module's docstring)."""
    gate(_BWRAP.probe(), ci=bool(os.environ.get("CI")))
    return _BWRAP
