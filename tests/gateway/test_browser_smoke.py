"""The browser the console's tests use (conftest's `browser` and `page`): a page of our own loads in
headless chromium, text set with textContent stays text, the vendored chart library draws, and
asyncio code still runs beside and after browser tests (conftest's _PlaywrightLoop)."""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import TYPE_CHECKING

import pytest

import gateway

if TYPE_CHECKING:  # the fixtures skip the tests when Playwright is missing
    from playwright.sync_api import Page

VENDOR = Path(gateway.__file__).parent / "console" / "static" / "vendor"

INDEX = b"""<!doctype html>
<html><head><meta charset="utf-8"><title>smoke</title></head>
<body><p id="out"></p>
<script>
  document.getElementById("out").textContent =
    '<script>window.injected = 1<\\/script><img src="x" onerror="window.injected = 2">';
  document.body.dataset.ready = "yes";
</script></body></html>
"""

CHART = b"""<!doctype html>
<html><head><meta charset="utf-8"><title>chart</title>
<link rel="stylesheet" href="/vendor/uplot/uPlot.min.css">
<script src="/vendor/uplot/uPlot.iife.min.js"></script></head>
<body><div id="chart"></div>
<script>
  new uPlot({width: 400, height: 200, series: [{}, {label: "requests", stroke: "blue"}]},
            [[1, 2, 3, 4], [5, 3, 8, 2]], document.getElementById("chart"));
</script></body></html>
"""

FILES = {
    "/": (INDEX, "text/html; charset=utf-8"),
    "/chart": (CHART, "text/html; charset=utf-8"),
    "/vendor/uplot/uPlot.iife.min.js": (
        (VENDOR / "uplot" / "uPlot.iife.min.js").read_bytes(),
        "text/javascript; charset=utf-8",
    ),
    "/vendor/uplot/uPlot.min.css": ((VENDOR / "uplot" / "uPlot.min.css").read_bytes(), "text/css"),
}


class Handler(BaseHTTPRequestHandler):
    def do_GET(self) -> None:
        body, content_type = FILES.get(self.path, (b"not found", "text/plain"))
        self.send_response(200 if self.path in FILES else 404)
        self.send_header("Content-Type", content_type)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, format: str, *args: object) -> None:
        pass  # quiet


@pytest.fixture(scope="module")
def site() -> Iterator[str]:
    """FILES served on 127.0.0.1 from a thread; the base URL."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()
        thread.join()


def test_page_loads_and_text_set_as_text_content_is_not_run(page: Page, site: str) -> None:
    response = page.goto(site + "/")
    assert response is not None and response.status == 200
    assert page.title() == "smoke"
    assert page.locator("body").get_attribute("data-ready") == "yes"
    out = page.locator("#out")
    assert out.text_content() == (
        '<script>window.injected = 1</script><img src="x" onerror="window.injected = 2">'
    )
    assert out.evaluate("node => node.children.length") == 0
    assert page.evaluate("() => window.injected") is None


def test_vendored_chart_library_draws(page: Page, site: str) -> None:
    errors: list[str] = []
    page.on("pageerror", lambda exc: errors.append(str(exc)))
    page.goto(site + "/chart")
    assert page.evaluate("() => typeof uPlot") == "function"
    assert page.locator("#chart canvas").count() == 1
    assert page.locator("#chart .u-legend").inner_text().find("requests") >= 0
    assert errors == []


@pytest.fixture
def computed() -> str:
    """A fixture running asyncio code, set up in the same test as `page`."""
    return asyncio.run(asyncio.sleep(0, "ran"))


def test_asyncio_beside_the_browser(page: Page, computed: str) -> None:
    page.set_content("<p>one</p>")
    assert computed == "ran"
    # In a test's body Playwright holds the thread's event loop: asyncio code runs on a thread.
    with ThreadPoolExecutor(1) as pool:
        assert pool.submit(asyncio.run, asyncio.sleep(0, "ran too")).result() == "ran too"
    assert page.locator("p").text_content() == "one"


def test_asyncio_run_works_in_a_test_without_the_browser() -> None:
    # Runs after the browser tests, while the session's browser is still open.
    assert asyncio.run(asyncio.sleep(0, "ran")) == "ran"
