"""Headless Chromium (the Debian package) driven by Playwright, for the admin console tests.

Playwright's own browser download cannot work here (closed network), so the system
Chromium is launched by path; `scripts/ensure_test_tools.sh` installs it.
"""

from __future__ import annotations

import os
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from urllib.parse import urlsplit

CHROMIUM = os.environ.get("CRONYARD_CHROMIUM", "/usr/bin/chromium")
# Without the background-networking flags Chromium dials out at start-up, and this
# machine's closed network refuses those connections (slow, noisy start).
CHROMIUM_ARGS = (
    "--no-sandbox",  # we run as root, where the sandbox refuses to start
    "--disable-gpu",
    "--disable-quic",
    "--no-first-run",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
)
TIMEOUT_MS = 10_000
VIEWPORT = {"width": 1440, "height": 900}
SCREENSHOTS = Path(__file__).resolve().parent.parent.parent / "var" / "screenshots"
LOCAL_HOSTS = ("127.0.0.1", "localhost")


def chromium_path() -> str:
    if not Path(CHROMIUM).is_file():
        raise RuntimeError(
            f"{CHROMIUM} not found: the console tests need Debian's Chromium; "
            "run scripts/ensure_test_tools.sh"
        )
    return CHROMIUM


@contextmanager
def chromium() -> Iterator[object]:
    """One headless browser, closed on exit. Playwright gives it a fresh temporary
    profile (--user-data-dir) of its own and removes it afterwards."""
    from playwright.sync_api import sync_playwright

    # Playwright's sync API keeps an asyncio loop marked running on this thread, so
    # Django would refuse every ORM call of the test as "async context". The ORM here
    # is still plain synchronous code on its own connection: allow it while the browser is open.
    previous = os.environ.get("DJANGO_ALLOW_ASYNC_UNSAFE")
    os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = "true"
    try:
        with sync_playwright() as playwright:
            browser = playwright.chromium.launch(
                executable_path=chromium_path(), headless=True, args=list(CHROMIUM_ARGS)
            )
            try:
                yield browser
            finally:
                browser.close()
    finally:
        if previous is None:
            os.environ.pop("DJANGO_ALLOW_ASYNC_UNSAFE", None)
        else:
            os.environ["DJANGO_ALLOW_ASYNC_UNSAFE"] = previous


@dataclass
class PageProblems:
    """What a page did wrong that no assertion on its text would see."""

    js_errors: list[str] = field(default_factory=list)
    failed_assets: list[str] = field(default_factory=list)
    # Every page must work offline: nothing may be fetched from another host.
    foreign_requests: list[str] = field(default_factory=list)

    def watch(self, page) -> None:
        page.on("pageerror", lambda exc: self.js_errors.append(str(exc)))
        page.on(
            "request",
            lambda r: (
                self.foreign_requests.append(r.url)
                if urlsplit(r.url).scheme in ("http", "https", "ws", "wss")
                and urlsplit(r.url).hostname not in LOCAL_HOSTS
                else None
            ),
        )
        # Stopped inside the browser by the page's own Content-Security-Policy: it never
        # left the machine, so it is not a foreign load.
        page.on(
            "requestfailed",
            lambda r: (
                self.foreign_requests.remove(r.url)
                if (r.failure or "").lower() in ("csp", "net::err_blocked_by_csp")
                and r.url in self.foreign_requests
                else None
            ),
        )
        page.on(
            "response",
            lambda r: (
                self.failed_assets.append(f"{r.status} {r.url}")
                if r.status >= 400 and "/static/" in r.url
                else None
            ),
        )


def screenshot(page, name: str, *, full_page: bool = True) -> Path:
    """PNG under var/screenshots/ (the whole page, or the 1440x900 window), to look at
    (and for the README tour)."""
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    path = SCREENSHOTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=full_page)
    return path


def log_in(page, base_url: str, username: str, password: str, next_path: str = "/admin/") -> None:
    """Through the real login form, as a person would."""
    page.goto(f"{base_url}/admin/login/?next={next_path}")
    page.fill("#id_username", username)
    page.fill("#id_password", password)
    with page.expect_navigation():
        page.click("input[type=submit]")


def row(page, text: str):
    """The changelist row whose cells contain `text`."""
    return page.locator("#result_list tbody tr", has_text=text)


def listed_names(page) -> list[str]:
    """First link column of every changelist row (the object's name)."""
    return page.locator("#result_list tbody tr th a").all_inner_texts()


def messages(page) -> list[tuple[str, str]]:
    """(level, text) of each message Django shows at the top of the page."""
    items = page.locator(".messagelist li")
    return [
        (items.nth(i).get_attribute("class") or "", items.nth(i).inner_text()) for i in range(items.count())
    ]


def run_action(page, action: str, *texts: str) -> list[tuple[str, str]]:
    """Tick the rows containing `texts`, pick `action` in the actions dropdown, press Go;
    return the messages of the page it lands on."""
    for text in texts:
        row(page, text).locator("input.action-select").check()
    page.select_option("select[name=action]", action)
    with page.expect_navigation():
        page.click("button[name=index]")
    return messages(page)
