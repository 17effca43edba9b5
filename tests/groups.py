"""The end of a test run says which groups of tests ran and which skipped, and why.

A green run that skipped every PostgreSQL test looks like any other green run; this summary
makes the difference visible (``make test`` promises the whole suite). Each test is counted in
the first group it belongs to, in the order of ``GROUPS``.
"""

from __future__ import annotations

import os
from collections import Counter
from collections.abc import Generator
from dataclasses import dataclass, field
from urllib.parse import urlsplit

import pytest

POSTGRES = "PostgreSQL"
EMBEDDED = "embedded model"
BROWSER = "browser (Chromium)"
SANDBOX = "sandbox (bubblewrap)"
SLOW = "other slow tests"
REST = "the rest"
GROUPS = (POSTGRES, EMBEDDED, BROWSER, SANDBOX, SLOW, REST)
_POSTGRES_FIXTURES = {"postgres_url", "postgres_database"}
_GROUP = "tether-test-group"


def group_of(item: pytest.Item) -> str:
    callspec = getattr(item, "callspec", None)
    params = callspec.params.values() if callspec is not None else ()
    fixtures = set(getattr(item, "fixturenames", ()))
    # A store fixture parametrized over backends reaches PostgreSQL through its "postgres" param.
    if fixtures & _POSTGRES_FIXTURES or any(p == "postgres" for p in params if isinstance(p, str)):
        return POSTGRES
    if item.get_closest_marker("real_model") is not None:
        return EMBEDDED
    if item.get_closest_marker("browser") is not None:
        return BROWSER
    if "bubblewrap" in fixtures:  # tests/tools/conftest.py: the sandbox tests' gate
        return SANDBOX
    if item.get_closest_marker("slow") is not None:
        return SLOW
    return REST


@dataclass
class _Tally:
    ran: int = 0
    failed: int = 0
    skipped: Counter[str] = field(default_factory=Counter)


class GroupSummary:
    def __init__(self) -> None:
        self._groups: dict[str, str] = {}
        self._outcomes: dict[str, tuple[str, str]] = {}

    # Under pytest-xdist the workers collect and run the tests and this process only hears their
    # reports, so the group travels in each report's user properties, set where the item is known.
    def pytest_collection_modifyitems(self, items: list[pytest.Item]) -> None:
        for item in items:
            item.user_properties.append((_GROUP, group_of(item)))

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        for name, value in report.user_properties:
            if name == _GROUP:
                self._groups[report.nodeid] = str(value)
        previous = self._outcomes.get(report.nodeid, ("", ""))
        if previous[0] == "failed":
            return
        if report.failed:
            self._outcomes[report.nodeid] = ("failed", "")
        elif report.skipped and not hasattr(report, "wasxfail"):
            reason = report.longrepr[2] if isinstance(report.longrepr, tuple) else "skipped"
            self._outcomes[report.nodeid] = ("skipped", reason.removeprefix("Skipped: "))
        elif report.when == "call":
            self._outcomes[report.nodeid] = ("ran", "")

    # The outermost wrapper: printed after pytest's own summary (its list of every skip), right
    # above the final count, where it is seen.
    @pytest.hookimpl(wrapper=True, tryfirst=True)
    def pytest_terminal_summary(
        self, terminalreporter: pytest.TerminalReporter
    ) -> Generator[None, None, None]:
        yield
        self._print(terminalreporter)

    def _print(self, terminalreporter: pytest.TerminalReporter) -> None:
        tallies: dict[str, _Tally] = {}
        for nodeid, (outcome, reason) in self._outcomes.items():
            tally = tallies.setdefault(self._groups.get(nodeid, REST), _Tally())
            if outcome == "skipped":
                tally.skipped[reason] += 1
            else:
                tally.ran += 1
                tally.failed += outcome == "failed"
        if not tallies:
            return
        terminalreporter.write_sep("-", "test groups")
        width = max(len(name) for name in tallies)
        for name in GROUPS:
            if name in tallies:
                line = f"{name:<{width}}  {describe(tallies[name])}"
                if name == POSTGRES and tallies[name].ran:
                    line += f"  [{_database()}]"
                terminalreporter.write_line(line)


def describe(tally: _Tally) -> str:
    parts = [f"{tally.ran} ran" + (f" ({tally.failed} failed)" if tally.failed else "")]
    skipped = sum(tally.skipped.values())
    if skipped:
        reasons = [
            (f"{count}× " if len(tally.skipped) > 1 else "") + _short(reason)
            for reason, count in tally.skipped.most_common(3)
        ]
        more = len(tally.skipped) - len(reasons)
        parts.append(
            f"{skipped} skipped: " + "; ".join(reasons) + (f"; {more} more reasons" if more else "")
        )
    return ", ".join(parts)


def _short(reason: str, limit: int = 140) -> str:
    reason = " ".join(reason.split())
    return reason if len(reason) <= limit else reason[: limit - 1] + "…"


def _database() -> str:
    url = urlsplit(os.environ.get("TETHER_TEST_POSTGRES_URL", ""))
    return f"{url.path.lstrip('/')} on {url.hostname}:{url.port or 5432}"
