"""In local mode (no API keys) the console opens directly; ``/docs`` and ``/redoc`` render in
Chromium with every request kept on this server (anything else is aborted and fails the test)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from urllib.parse import urlsplit

import pytest
from playwright.sync_api import Browser, Page, Route, expect

from tests.console.conftest import APP, TIMEOUT_MS, Console, Shoot
from tests.server.conftest import Server, start_server
from tether.testing.fake_openai import FakeOpenAIServer

pytestmark = [pytest.mark.browser, pytest.mark.slow]
expect.set_options(timeout=TIMEOUT_MS)


@pytest.fixture(scope="module")
def local_server(
    tmp_path_factory: pytest.TempPathFactory, fake: FakeOpenAIServer
) -> Iterator[Server]:
    srv = start_server(
        tmp_path_factory.mktemp("local"), env={"FAKE_OPENAI_URL": fake.base_url}, target=APP
    )
    yield srv
    srv.stop()


@pytest.fixture
def console(chromium: Browser, local_server: Server) -> Iterator[Console]:
    made = Console(local_server, chromium, {})
    yield made
    made.close()


def offline(page: Page, host: str) -> list[str]:
    """Abort every request to anywhere but ``host``; the list of those that were tried."""
    outside: list[str] = []

    def guard(route: Route) -> None:
        url = route.request.url
        if urlsplit(url).netloc == host or url.startswith(("data:", "blob:")):
            route.continue_()
        else:
            outside.append(url)
            route.abort()

    page.route("**/*", guard)
    return outside


def test_local_mode_opens_directly(console: Console, shoot: Shoot) -> None:
    page = console.page()
    outside = offline(page, urlsplit(console.url).netloc)
    page.goto(console.url + "/")
    expect(page.get_by_role("heading", name="Sessions", exact=True)).to_be_visible()
    expect(page.get_by_text("local mode")).to_be_visible()
    expect(page.get_by_role("form", name="Sign in")).to_have_count(0)
    expect(page.get_by_role("button", name="Sign out")).to_have_count(0)
    # Local mode's changes come from the server's own origin, which it allows.
    page.get_by_role("button", name="Create session").click()
    expect(page.get_by_role("textbox", name="Message")).to_be_visible()
    page.get_by_role("textbox", name="Message").fill("hello from local mode")
    page.keyboard.press("Enter")
    expect(page.locator("article.turn .text")).to_have_text("echo: hello from local mode")
    docs = page.get_by_role("link", name="API docs")
    assert docs.get_attribute("href") == "/docs"
    page.goto(console.url + "/#/account")
    expect(page.get_by_text("Local mode: this server has no API keys")).to_be_visible()
    assert outside == []


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_the_api_docs_render_offline(console: Console, path: str) -> None:
    page = console.page()
    outside = offline(page, urlsplit(console.url).netloc)
    page.goto(console.url + path)
    # Both render the operations from /openapi.json: the agent list is one.
    expect(page.get_by_text("/v1/agents").first).to_be_visible()
    assert outside == [], outside


def test_dark_and_light_follow_the_system(console: Console) -> None:
    colours = {}
    for scheme in ("light", "dark"):
        context = console.browser.new_context(color_scheme=scheme)
        console.contexts.append(context)
        page = console.tab(context, None)
        page.goto(console.url + "/")
        expect(page.get_by_role("heading", name="Sessions", exact=True)).to_be_visible()
        colours[scheme] = page.evaluate("getComputedStyle(document.body).backgroundColor")
    brightness = {
        scheme: sum(int(v) for v in re.findall(r"\d+", colour)[:3])
        for scheme, colour in colours.items()
    }
    assert brightness["dark"] < 150 < brightness["light"], colours
