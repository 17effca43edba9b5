"""Browser tests of the web console: Playwright driving Debian's Chromium against a real
``tether serve`` subprocess whose agents run on the fake OpenAI server.

Nothing is downloaded: Playwright is launched on the system's ``/usr/bin/chromium`` (or
``TETHER_TEST_CHROMIUM``), never on a browser of its own. Without one the tests skip, saying how
to get it. Every page a test opens fails the test on an uncaught script error
(``pageerror``) and on any answer of 500 or more to a request of the console.

Screenshots go to ``.artifacts/console/`` in the checkout (``TETHER_TEST_ARTIFACTS`` to
choose another directory).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import httpx
import pytest

from tests.server.cli_keys import create_key
from tests.server.conftest import ROOT, Server, start_server
from tether.testing.fake_openai import FakeOpenAIServer

if TYPE_CHECKING:
    from playwright.sync_api import Browser, BrowserContext, Page

CHROMIUM = os.environ.get("TETHER_TEST_CHROMIUM", "/usr/bin/chromium")
ARTIFACTS = Path(os.environ.get("TETHER_TEST_ARTIFACTS", ROOT / ".artifacts" / "console"))
APP = "tests.console.apps:app"
DESKTOP = {"width": 1280, "height": 800}
PHONE = {"width": 375, "height": 812}
TIMEOUT_MS = 15_000
"""How long an expectation waits for the page (a turn, an upload): generous for a busy CI."""

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def chromium() -> Iterator[Browser]:
    """Debian's Chromium under Playwright, one per module (the sync API owns an event loop of
    its own while it runs, so it is not kept alive across other modules' async tests)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(
            f"browser tests skipped: no Chromium at {CHROMIUM}; install Debian's "
            "(apt-get install chromium; .ci/run does) or set TETHER_TEST_CHROMIUM"
        )
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:  # pragma: no cover - playwright is a dev dependency
        pytest.skip("browser tests skipped: playwright is not installed (pip install -e '.[dev]')")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="module")
def fake() -> Iterator[FakeOpenAIServer]:
    with FakeOpenAIServer() as srv:
        yield srv


@pytest.fixture(autouse=True)
def _fresh_fake(request: pytest.FixtureRequest) -> None:
    """Each test scripts the model from an empty script, at full speed."""
    if "fake" in request.fixturenames:
        fake: FakeOpenAIServer = request.getfixturevalue("fake")
        fake.reset()
        fake.chunk_delay_ms = 0


@dataclass
class Guard:
    """What a page did wrong: uncaught script errors and 5xx answers."""

    errors: list[str] = field(default_factory=list)
    server_errors: list[str] = field(default_factory=list)

    def check(self) -> None:
        assert not self.errors, f"uncaught errors in the console: {self.errors}"
        assert not self.server_errors, f"console requests answered 5xx: {self.server_errors}"


@dataclass
class Console:
    """A server for the console and the pages a test opened on it."""

    server: Server
    browser: Browser
    keys: dict[str, str]
    guards: list[Guard] = field(default_factory=list)
    contexts: list[BrowserContext] = field(default_factory=list)

    @property
    def url(self) -> str:
        return self.server.url

    def page(self, user: str | None = None, viewport: dict[str, int] | None = None) -> Page:
        """A new tab of a new browser profile, signed in as ``user`` (its key put in session
        storage before the console loads, as the sign-in form would), or not signed in."""
        context = self.browser.new_context(viewport=viewport or DESKTOP)  # type: ignore[arg-type]
        context.set_default_timeout(TIMEOUT_MS)
        self.contexts.append(context)
        return self.tab(context, user)

    def tab(self, context: BrowserContext, user: str | None) -> Page:
        """Another tab in ``context`` (tabs do not share session storage: each signs in)."""
        page = context.new_page()
        if user is not None:
            key = self.keys[user]
            page.add_init_script(f"sessionStorage.setItem('tether.apiKey', {key!r})")
        guard = Guard()
        page.on("pageerror", lambda error: guard.errors.append(str(error)))
        page.on(
            "response",
            lambda response: (
                guard.server_errors.append(f"{response.status} {response.url}")
                if response.status >= 500
                else None
            ),
        )
        self.guards.append(guard)
        return page

    def api(self, user: str) -> httpx.Client:
        return self.server.client(self.keys[user])

    def close(self) -> None:
        for context in self.contexts:
            context.close()
        self.contexts.clear()
        guards, self.guards = self.guards, []
        for guard in guards:
            guard.check()


USERS = ("alice", "bob", "carol", "dave", "erin")


@pytest.fixture(scope="module")
def keyed_server(
    tmp_path_factory: pytest.TempPathFactory, fake: FakeOpenAIServer
) -> Iterator[tuple[Server, dict[str, str]]]:
    """A server with API keys (made as an operator makes them, with ``tether keys create``)."""
    data = tmp_path_factory.mktemp("console")
    keys = {user: create_key(data, user).secret for user in USERS}
    server = start_server(data, env={"FAKE_OPENAI_URL": fake.base_url}, target=APP)
    yield server, keys
    server.stop()
    assert "unhandled error" not in server.output().lower(), server.output()


@pytest.fixture
def console(chromium: Browser, keyed_server: tuple[Server, dict[str, str]]) -> Iterator[Console]:
    server, keys = keyed_server
    made = Console(server, chromium, keys)
    yield made
    made.close()


Shoot = Callable[["Page", str], None]


@pytest.fixture
def shoot() -> Shoot:
    """Save a screenshot of what ``page`` shows now, at desktop size and at 375 px."""

    def take(page: Page, name: str) -> None:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        before = page.viewport_size or DESKTOP
        for label, size in (("desktop", DESKTOP), ("375px", PHONE)):
            page.set_viewport_size(size)  # type: ignore[arg-type]
            page.wait_for_timeout(150)  # let the layout settle before the picture
            page.screenshot(path=str(ARTIFACTS / f"{name}-{label}.png"))
        page.set_viewport_size(before)  # type: ignore[arg-type]

    return take
