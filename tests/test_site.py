"""The built website and slide decks, opened in headless Chromium with the network blocked.

Run by ``make test-site`` (part of ``make test``) after ``make site slides``; selected
with ``-m site`` only, so the unit-test runs do not start a browser. Needs Debian's
``chromium`` and ``chromium-driver`` (``.ci/run`` installs them) and selenium (the
``docs`` extra). Each page must show its title, load every image, log no console error
and send no request off the machine (every host but 127.0.0.1 resolves nowhere, and any
request to one fails the test). Screenshots go to ``build/screenshots/``.
"""

from __future__ import annotations

import functools
import http.server
import json
import pathlib
import re
import shutil
import threading
import time
import urllib.parse

import pytest

pytestmark = pytest.mark.site

ROOT = pathlib.Path(__file__).resolve().parent.parent
BUILD = ROOT / "build"
SITE, SLIDES, SHOTS = BUILD / "site", BUILD / "slides", BUILD / "screenshots"
CHAPTERS = sorted((ROOT / "notebooks").glob("*.ipynb"))


def _title(ipynb: pathlib.Path) -> str:
    cells = json.loads(ipynb.read_text(encoding="utf-8"))["cells"]
    first = "".join(cells[0]["source"]).split("\n")[0]
    return re.sub(r"[`*]", "", first.lstrip("# ")).strip()


@pytest.fixture(scope="module")
def server():
    if not (SITE / "docs" / "index.html").exists():
        pytest.fail("build/site is missing: run `make site` (make test-site does)")
    class Quiet(http.server.SimpleHTTPRequestHandler):
        def log_message(self, *args):  # one line per request would bury the results
            pass

    handler = functools.partial(Quiet, directory=str(SITE))
    httpd = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    thread = threading.Thread(target=httpd.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{httpd.server_address[1]}"
    httpd.shutdown()
    httpd.server_close()


@pytest.fixture(scope="module")
def browser():
    webdriver = pytest.importorskip("selenium.webdriver")
    chromium = shutil.which("chromium") or shutil.which("chromium-browser")
    driver_path = shutil.which("chromedriver")
    if not chromium or not driver_path:
        pytest.fail("headless Chromium needs Debian's chromium and chromium-driver "
                    "(apt-get install chromium chromium-driver; .ci/run does)")
    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for arg in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                "--window-size=1280,900", "--no-first-run", "--disable-background-networking",
                "--disable-component-update", "--disable-sync", "--disable-default-apps",
                "--allow-file-access-from-files",
                # The network is blocked: every host except this machine resolves nowhere.
                "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL", "performance": "ALL"})
    from selenium.webdriver.chrome.service import Service

    driver = webdriver.Chrome(service=Service(driver_path), options=options)
    driver.set_page_load_timeout(60)
    yield driver
    driver.quit()


def _open(driver, url: str) -> dict:
    """Load ``url`` and return what it did: off-machine requests, console errors, broken images."""
    driver.get_log("performance")  # drop what earlier pages logged
    driver.get_log("browser")
    driver.get(url)
    deadline = time.time() + 30
    while driver.execute_script("return document.readyState") != "complete":
        if time.time() > deadline:
            raise AssertionError(f"{url} did not finish loading in 30 s")
        time.sleep(0.1)
    driver.execute_script("window.scrollTo(0, document.body.scrollHeight);")
    time.sleep(0.5)  # late requests (fonts, MathJax's pieces) reach the log
    offsite = []
    for entry in driver.get_log("performance"):
        message = json.loads(entry["message"])["message"]
        if message["method"] != "Network.requestWillBeSent":
            continue
        req = message["params"]["request"]["url"]
        parts = urllib.parse.urlsplit(req)
        if parts.scheme in ("data", "blob", "file", "about", "chrome", "devtools"):
            continue
        if parts.hostname != "127.0.0.1":
            offsite.append(req)
    errors = [e["message"] for e in driver.get_log("browser") if e["level"] == "SEVERE"]
    broken = driver.execute_script(
        "return Array.from(document.images).filter(i => !i.complete || i.naturalWidth === 0)"
        ".map(i => i.currentSrc || i.src).map(s => s.slice(0, 120));")
    return {"offsite": offsite, "errors": errors, "broken_images": broken,
            "images": driver.execute_script("return document.images.length;")}


def _assert_clean(url: str, seen: dict) -> None:
    assert not seen["offsite"], f"{url} sent requests off the machine: {seen['offsite'][:5]}"
    assert not seen["errors"], f"{url} logged console errors: {seen['errors'][:5]}"
    assert not seen["broken_images"], f"{url} has images that did not load: {seen['broken_images']}"


def _shot(driver, name: str) -> None:
    SHOTS.mkdir(parents=True, exist_ok=True)
    driver.execute_script("window.scrollTo(0, 0);")
    time.sleep(0.3)
    path = SHOTS / name
    driver.save_screenshot(str(path))
    print(f"screenshot: {path}")


def test_home_page(server, browser):
    url = f"{server}/docs/index.html"
    seen = _open(browser, url)
    assert "tpu-course" in browser.title
    _assert_clean(url, seen)
    links = browser.execute_script(
        "return Array.from(document.querySelectorAll('article a')).map(a => a.href);")
    for ipynb in CHAPTERS:  # each chapter, its lab and solution are one click away
        for folder in ("notebooks", "labs", "solutions"):
            if (ROOT / folder / ipynb.name).exists():
                assert any(link.endswith(f"/{folder}/{ipynb.stem}.html") for link in links), \
                    f"the home page does not link {folder}/{ipynb.stem}"
    _shot(browser, "home.png")


@pytest.mark.parametrize("ipynb", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_page(server, browser, ipynb):
    url = f"{server}/notebooks/{ipynb.stem}.html"
    seen = _open(browser, url)
    assert _title(ipynb) in browser.title, (browser.title, _title(ipynb))
    _assert_clean(url, seen)
    launch = browser.execute_script(
        "return Array.from(document.querySelectorAll('a')).map(a => a.href);")
    assert any("colab.research.google.com" in link for link in launch), "no Colab launch link"
    assert any("kaggle.com" in link for link in launch), "no Kaggle launch link"
    if ipynb.stem.startswith("01_"):
        _shot(browser, "chapter1.png")


def test_chapter1_animation_steps_without_a_kernel(server, browser):
    url = f"{server}/notebooks/{CHAPTERS[0].stem}.html"
    _open(browser, url)
    players = browser.find_elements("css selector", "div.tpc-player")
    assert len(players) == 1, "chapter 1 should show one self-contained animation player"
    frame = players[0].find_element("css selector", "img")
    before = frame.get_attribute("src")
    assert frame.get_property("naturalWidth") > 0
    browser.execute_script("arguments[0].scrollIntoView({block: 'center'});", players[0])
    players[0].find_element("css selector", "button[data-act=next]").click()
    after = frame.get_attribute("src")
    assert after != before, "the step button did not change the frame"
    assert "frame 2 /" in players[0].text


DECKS = sorted(SLIDES.glob("*.slides.html"))


def test_every_chapter_has_a_deck():
    names = {d.name for d in DECKS}
    missing = [p.stem for p in CHAPTERS if f"{p.stem}.slides.html" not in names]
    assert not missing, f"no deck for {missing}: run `make slides`"


@pytest.mark.parametrize("deck", DECKS, ids=[d.stem for d in DECKS])
def test_deck_opens_offline_and_moves_forward(browser, deck):
    url = deck.as_uri()  # from the file system, as from a USB stick
    seen = _open(browser, url)
    _assert_clean(url, seen)
    ready = browser.execute_script("return typeof Reveal !== 'undefined' && Reveal.isReady();")
    assert ready, f"{deck.name}: reveal.js did not start"
    total = browser.execute_script("return Reveal.getTotalSlides();")
    assert total >= 10, f"{deck.name} has {total} slides, fewer than 10"
    browser.execute_script("Reveal.slide(0, 0);")
    before = browser.execute_script("return JSON.stringify(Reveal.getIndices());")
    browser.execute_script("Reveal.next();")
    after = browser.execute_script("return JSON.stringify(Reveal.getIndices());")
    assert after != before, f"{deck.name}: moving forward did not change the slide"
    if deck == DECKS[0]:
        browser.execute_script("Reveal.slide(3, 0);")
        time.sleep(0.8)  # the slide transition
        _shot(browser, "deck.png")
