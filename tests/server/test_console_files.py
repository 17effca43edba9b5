"""The console's files and the offline API docs, over plain HTTP: ``/`` is the console's page,
its modules and stylesheet are served under ``/console/``, and ``/docs`` and ``/redoc`` load
Swagger UI and ReDoc from the server itself, never from a CDN.

(What the console does in a browser is tested in tests/console, in Chromium.)
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest

from tests.server.conftest import Server, start_server
from tether.server.routes.console import CONSOLE_DIR

pytestmark = pytest.mark.slow

EXTERNAL = re.compile(
    r"""(?:src|href)\s*=\s*["']?\s*(?:https?:)?//|url\s*:\s*["']https?://""", re.I
)
REFERENCES = re.compile(r"""(?:src|href)\s*=\s*["']([^"']+)["']""")
IMPORTS = re.compile(r"""(?:^|\n)\s*import\s[^;]*?from\s+["'](\./[^"']+)["']""")


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    srv = start_server(tmp_path_factory.mktemp("console-files"))
    yield srv
    srv.stop()


def test_the_console_page_is_served_at_the_root(server: Server) -> None:
    with server.client() as c:
        page = c.get("/")
        assert page.status_code == 200
        assert page.headers["content-type"].startswith("text/html")
        csp = page.headers["content-security-policy"]
        assert "default-src 'self'" in csp and "frame-ancestors 'none'" in csp
        assert not EXTERNAL.search(page.text), page.text
        for ref in REFERENCES.findall(page.text):
            if ref.startswith("/console/"):
                assert c.get(ref).status_code == 200, ref
        script = c.get("/console/js/main.js")
        assert script.status_code == 200
        assert "javascript" in script.headers["content-type"]
        assert c.get("/console/console.css").headers["content-type"].startswith("text/css")
        assert c.get("/console/nothing-here.js").status_code == 404
        # Not part of the API's description.
        paths = c.get("/openapi.json").json()["paths"]
        assert not [p for p in paths if p == "/" or p.startswith(("/console", "/docs", "/redoc"))]


def test_every_module_the_console_imports_is_served(server: Server) -> None:
    modules = sorted(CONSOLE_DIR.glob("js/*.js"))
    assert modules
    with server.client() as c:
        for module in modules:
            for name in IMPORTS.findall(module.read_text()):
                target = (module.parent / name).resolve()
                assert target.is_file(), f"{module.name} imports {name}, which does not exist"
                url = "/console/" + target.relative_to(CONSOLE_DIR).as_posix()
                assert c.get(url).status_code == 200, url
            # Plain modules, no build step: nothing imported from a package or a URL.
            assert not re.search(r"""from\s+["'](?!\./)""", module.read_text()), module.name


@pytest.mark.parametrize("path", ["/docs", "/redoc"])
def test_the_api_docs_reference_nothing_outside_the_server(server: Server, path: str) -> None:
    with server.client() as c:
        page = c.get(path)
        assert page.status_code == 200
        assert not EXTERNAL.search(page.text), page.text
        assert "cdn" not in page.text.lower() and "googleapis" not in page.text
        refs = REFERENCES.findall(page.text)
        assert refs, page.text
        for ref in refs:
            assert ref.startswith("/"), ref
            asset = c.get(ref)
            assert asset.status_code == 200, ref
            assert len(asset.content) > 1000, ref
        assert "/openapi.json" in page.text


def test_the_docs_assets_come_from_the_package(server: Server) -> None:
    import fastapi_offline

    static = Path(fastapi_offline.__file__).parent / "static"
    with server.client() as c:
        served = c.get("/console/vendor/swagger-ui-bundle.js")
    assert served.content == (static / "swagger-ui-bundle.js").read_bytes()


def test_api_paths_still_answer_as_before(server: Server) -> None:
    with server.client() as c:
        assert c.get("/v1/agents").status_code == 200
        r = c.get("/v1/nothing")
        assert r.status_code == 404
        assert r.headers["content-type"] == "application/problem+json"
    assert httpx.get(server.url + "/healthz").json() == {"status": "ok"}


def test_probes_may_send_head(server: Server) -> None:
    """Load balancers' and uptime checkers' probes send HEAD: the health, console and docs
    pages answer it as they answer GET, without a body (405 before)."""
    with server.client() as c:
        for path in ("/healthz", "/readyz", "/", "/docs", "/redoc"):
            got, head = c.get(path), c.head(path)
            assert (head.status_code, head.content) == (200, b""), path
            assert head.headers["content-type"] == got.headers["content-type"], path
