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
SITE, SLIDES, SHOTS = BUILD / "site", BUILD / "site" / "slides", BUILD / "screenshots"
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
    browser.set_window_size(390, 844)
    _shot(browser, "home-phone.png")
    browser.set_window_size(1280, 900)


# Code blocks wider than the page's code column on a desktop (1400 px): notebook lines
# stay within 88 characters (CONTRIBUTING; tests/test_notebooks.py holds the twins to it),
# and docs/_static/course.css sets code small enough for 88 characters to fit.
CODE_OVERFLOW = """
return Array.from(document.querySelectorAll('article div.highlight pre, article div.output pre'))
  .filter(p => p.scrollWidth > p.clientWidth + 2)
  .map(p => p.innerText.split('\\n').reduce((a, b) => a.length > b.length ? a : b).slice(0, 60));
"""


@pytest.mark.parametrize("ipynb", CHAPTERS, ids=[p.stem for p in CHAPTERS])
def test_chapter_page(server, browser, ipynb):
    browser.set_window_size(1400, 900)
    url = f"{server}/notebooks/{ipynb.stem}.html"
    seen = _open(browser, url)
    assert _title(ipynb) in browser.title, (browser.title, _title(ipynb))
    _assert_clean(url, seen)
    badges = browser.execute_script(
        "return Array.from(document.querySelectorAll('article .course-launch a')).map(a => a.href);")
    assert any("colab.research.google.com" in link for link in badges), "no Colab badge"
    assert any("kaggle.com" in link for link in badges), "no Kaggle badge"
    for folder in ("labs", "solutions"):  # linked from the page body
        assert any(link.endswith(f"/{folder}/{ipynb.stem}.html") for link in badges), folder
    text = browser.execute_script("return document.querySelector('article').innerText;")
    assert not re.search(r"\b0%\|", text), "a progress bar frozen at 0 %"
    assert "TPU_COURSE_SPEC" not in text or "course-setup" not in ipynb.read_text(), \
        "the setup cell (tagged course-setup) is shown"
    alts = browser.execute_script(
        "return Array.from(document.querySelectorAll('article img')).map(i => i.alt);")
    hashed = [a for a in alts if re.search(r"[0-9a-f]{32}", a)]
    assert not hashed, f"figures whose alt text is a file name: {hashed[:3]}"
    if ipynb.stem.startswith("01_"):
        _shot(browser, "chapter1.png")
    browser.set_window_size(1280, 900)


def test_no_code_block_is_wider_than_its_column(server, browser):
    browser.set_window_size(1400, 900)
    wide = {}
    try:
        for folder in ("notebooks", "labs", "solutions"):
            for ipynb in sorted((ROOT / folder).glob("*.ipynb")):
                browser.get(f"{server}/{folder}/{ipynb.stem}.html")
                found = browser.execute_script(CODE_OVERFLOW)
                if found:
                    wide[f"{folder}/{ipynb.stem}"] = found
    finally:
        browser.set_window_size(1280, 900)
    assert not wide, f"code blocks wider than the column: {wide}"


def test_lab_links_its_chapter_and_solution(server, browser):
    lab = next(p for p in sorted((ROOT / "labs").glob("*.ipynb")))
    _open(browser, f"{server}/labs/{lab.stem}.html")
    links = browser.execute_script(
        "return Array.from(document.querySelectorAll('article .course-related a')).map(a => a.href);")
    assert any(link.endswith(f"/notebooks/{lab.stem}.html") for link in links), links
    assert any(link.endswith(f"/solutions/{lab.stem}.html") for link in links), links


def test_sidebar_opens_on_a_phone_and_collapses_on_a_desktop(server, browser):
    """The menu button works (pydata-sphinx-theme 0.20's second, hidden button: course.js)."""
    url = f"{server}/notebooks/{CHAPTERS[0].stem}.html"
    try:
        for width in (390, 820, 1000):
            browser.set_window_size(width, 844)
            _open(browser, url)
            visible = [b for b in browser.find_elements("css selector", ".primary-toggle")
                       if b.is_displayed()]
            assert visible, f"no visible menu button at {width} px"
            def names():
                return " ".join(a.text for a in browser.find_elements(
                    "css selector", "nav.bd-links a") if a.is_displayed())

            shown = "Chapter 1" in names()
            visible[0].click()  # opens it (or, where it was shown, hides it)
            time.sleep(0.4)
            assert ("Chapter 1" in names()) != shown, f"the menu button did nothing at {width} px"
            if shown:
                visible[0].click()
                time.sleep(0.4)
            names = names()
            assert "Chapter 1" in names and "Chapter 7" in names, \
                f"the chapter list did not open at {width} px: {names[:200]!r}"
            if width == 390:
                SHOTS.mkdir(parents=True, exist_ok=True)
                browser.save_screenshot(str(SHOTS / "phone-sidebar.png"))
        browser.set_window_size(1400, 900)
        _open(browser, url)
        sidebar = browser.find_element("css selector", "#pst-primary-sidebar")
        assert sidebar.is_displayed()
        [b for b in browser.find_elements("css selector", ".primary-toggle") if b.is_displayed()][0].click()
        time.sleep(0.4)
        assert not sidebar.is_displayed() or sidebar.size["width"] < 5, \
            "the menu button did not collapse the sidebar on a desktop"
    finally:
        browser.set_window_size(1280, 900)


def test_page_and_search_from_the_disk(browser):
    """Opened from file:// (no server): a page loads cleanly, and search lists results
    without console errors, saying how to get excerpts."""
    page = (SITE / "notebooks" / f"{CHAPTERS[0].stem}.html").as_uri()
    _assert_clean(page, _open(browser, page))
    url = (SITE / "search.html").as_uri() + "?q=systolic"
    seen = _open(browser, url)
    deadline = time.time() + 20
    results = []
    while time.time() < deadline and not results:
        results = browser.find_elements("css selector", "#search-results li")
        time.sleep(0.2)
    seen["errors"] += [e["message"] for e in browser.get_log("browser") if e["level"] == "SEVERE"]
    _assert_clean(url, seen)
    assert results, "search from file:// found nothing for 'systolic'"
    assert "http.server" in browser.find_element("css selector", ".course-search-note").text
    browser.set_window_size(1400, 900)
    _shot(browser, "search-file.png")
    browser.set_window_size(1280, 900)


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

# Where a slide's content runs past the slide, measured independently of the deck's own
# fitting script: the slide's own scroll size, and every element's box against the
# slide's box (reveal.js scales the whole deck, so both are in the same units).
SLIDE_OVERFLOW = """
const slide = Reveal.getCurrentSlide();
const box = slide.getBoundingClientRect();
const out = [];
if (slide.scrollHeight > slide.clientHeight + 2) out.push(`scrolls ${slide.scrollHeight - slide.clientHeight}px`);
if (slide.scrollWidth > slide.clientWidth + 2) out.push(`scrolls sideways ${slide.scrollWidth - slide.clientWidth}px`);
for (const el of slide.querySelectorAll('*')) {
  if (el.closest('aside.notes, mjx-assistive-mml')) continue;  // notes; MathJax's screen-reader copy
  const r = el.getBoundingClientRect();
  if (r.width === 0 || r.height === 0) continue;
  if (r.right > box.right + 2 || r.bottom > box.bottom + 2) {
    out.push(`${el.tagName.toLowerCase()}.${el.className} ends ${Math.round(r.right - box.right)}px right, ${Math.round(r.bottom - box.bottom)}px below`);
    break;
  }
  const style = getComputedStyle(el);
  if (/(auto|scroll|hidden)/.test(style.overflowX + style.overflowY) && el !== slide
      && (el.scrollWidth > el.clientWidth + 2 || el.scrollHeight > el.clientHeight + 2)) {
    out.push(`${el.tagName.toLowerCase()}.${el.className} cut or scrolled inside`);
    break;
  }
}
return out;
"""


def test_every_chapter_has_a_deck():
    names = {d.name for d in DECKS}
    missing = [p.stem for p in CHAPTERS if f"{p.stem}.slides.html" not in names]
    assert not missing, f"no deck for {missing}: run `make slides`"


@pytest.mark.parametrize("deck", DECKS, ids=[d.stem for d in DECKS])
def test_deck_visits_every_slide_in_order_each_fitting_with_notes(browser, deck):
    """From the file system (a USB stick): "next" (the right arrow) visits every slide,
    vertical ones included, in order; no slide's content overflows; every code slide
    carries speaker notes."""
    url = deck.as_uri()
    seen = _open(browser, url)
    _assert_clean(url, seen)
    ready = browser.execute_script("return typeof Reveal !== 'undefined' && Reveal.isReady();")
    assert ready, f"{deck.name}: reveal.js did not start"
    total = browser.execute_script("Reveal.configure({transition: 'none'}); Reveal.slide(0, 0);"
                                   "return Reveal.getTotalSlides();")
    assert total >= 10, f"{deck.name} has {total} slides, fewer than 10"
    # One script walks the deck: measure the slide, then press the right arrow (a
    # keydown, as a presenter's key or clicker sends), until the last slide.
    walk = browser.execute_script(
        "const measure = () => { " + SLIDE_OVERFLOW + " };"
        "const steps = [];"
        "for (let i = 0; i <= arguments[0]; i++) {"
        "  steps.push([Reveal.getSlidePastCount(), JSON.stringify(Reveal.getIndices()),"
        "              (Reveal.getSlideNotes() || '').trim().length, measure(),"
        "              !!Reveal.getCurrentSlide().querySelector(':scope > .jp-CodeCell')]);"
        "  if (Reveal.isLastSlide()) break;"
        "  document.dispatchEvent(new KeyboardEvent('keydown',"
        "    {key: 'ArrowRight', keyCode: 39, which: 39, bubbles: true}));"
        "}"
        "return steps;", total)
    order = [past for past, *_ in walk]
    silent = [past + 1 for past, _, notes, _, code in walk if code and not notes]
    overflow = [f"slide {past + 1} {ix}: {problems[0]}" for past, ix, _, problems, _ in walk
                if problems]
    if deck == DECKS[0]:
        browser.execute_script("Reveal.slide(3, 0);")
        _shot(browser, "deck.png")
    assert order == list(range(total)), f"{deck.name}: next visited {order}, not 0..{total - 1}"
    assert not overflow, f"{deck.name}: slides whose content does not fit: {overflow}"
    # the prose is the notes: every code slide has the chapter's words for it
    assert not silent, f"{deck.name}: code slides {silent} have no speaker notes"
