"""The web console in a real browser (issue 15): headless Chromium from Debian, driven by Selenium, against
gunicorn. Sign in, search in Chinese, open a unit and its lineage, list with infinite scroll, timeline,
forget one unit and see it gone from search, bulk forget with its dry run, a hostile unit stays inert,
keyboard use, Chinese interface, 375 px wide, and the open (no-keys) mode.

Screenshots of each page go to the test's output folder (``<tmp>/screenshots``); with
``CONSOLE_SCREENSHOTS=DIR`` they are copied there too (that is how docs/console/*.png were made).
Chromium and chromedriver come from `.ci/setup.d/chromium.sh`; without them these tests skip."""
from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
import requests

from conftest import LiveServer, make_unit

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMEDRIVER = shutil.which("chromedriver")
pytestmark = pytest.mark.skipif(not (CHROMIUM and CHROMEDRIVER),
                                reason="chromium and chromedriver are not installed (.ci/setup.d/chromium.sh)")

ADMIN = "browser-admin-0123456789abcdef"
READER = "browser-reader-0123456789abcde"
KEYS = {ADMIN: ("acme", ["push", "search", "admin"]), READER: ("acme", ["push", "search"])}
HOSTILE = ('<script>window.__pwned = "script"; alert(1)</script> <img src=x onerror="window.__pwned=\'img\';alert(2)"> '
           '[点我](javascript:window.__pwned="link";alert(3)) <a href="javascript:alert(4)">link</a> 订单 HOSTILE')
WIDE, NARROW = (1280, 900), (375, 812)


@pytest.fixture(scope="module")
def shots(tmp_path_factory):
    folder = tmp_path_factory.mktemp("console") / "screenshots"
    folder.mkdir()
    yield folder
    target = os.environ.get("CONSOLE_SCREENSHOTS")
    if target:
        Path(target).mkdir(parents=True, exist_ok=True)
        for png in folder.glob("*.png"):
            shutil.copy(png, Path(target) / png.name)


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    s = LiveServer(tmp_path_factory.mktemp("console-live") / "data", workers=2, keys=KEYS)
    try:
        yield s.start()
    finally:
        s.stop()


def push(server, content, **fields):
    rv = requests.post(server.url + "/mcp/push", json=make_unit(content, **fields), headers=server.headers(ADMIN),
                       timeout=30)
    assert rv.status_code == 200, rv.text
    return rv.json()["cid"]


def wait_searchable(server, query, cids, timeout=30):
    """Until a default search (the read index) finds every one of ``cids``."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        rv = requests.post(server.url + "/mcp/search", json={"query": query, "top_k": 100},
                           headers=server.headers(ADMIN), timeout=30)
        if set(cids) <= {r["cid"] for r in rv.json()["results"]}:
            return
        time.sleep(0.1)
    raise AssertionError(f"{query!r} did not find {cids}")


@pytest.fixture(scope="module")
def world(server):
    now = int(time.time())
    w = {}
    w["question"] = push(server, "用户问：我的订单 ORD-7890 什么时候发货？", type="user_input", source="chat_v1_prod",
                         timestamp=now - 2 * 86_400)
    w["tool"] = push(server, '{"order_id": "ORD-7890", "status": "shipped", "carrier": "顺丰"} 订单已发货',
                     source="orders_api_v2_prod", parent_cid=w["question"], timestamp=now - 86_400,
                     metadata={"http_status": 200, "latency_ms": 41})
    w["thinking"] = push(server, "订单已经发货，应该把快递单号告诉用户。The order shipped; give the tracking number.",
                         type="model_thinking", source="agent_v3_prod", parent_cid=w["tool"], ttl=3600)
    w["notice"] = push(server, "System notice: 部署完成 deploy finished", type="system_notice", source="deploy_v1_prod")
    w["hostile"] = push(server, HOSTILE, source='<b onmouseover="alert(5)">evil</b>_v1',
                        metadata={"<img src=x onerror=alert(6)>": "javascript:alert(7)"})
    w["forget_me"] = push(server, "临时笔记 scratch note to forget 订单", source="scratch_v1")
    for i in range(70):
        push(server, f"日志 log line {i}: 构建 build {i} ok", type=("tool_output", "system_notice")[i % 2],
             source=f"ci_runner_v{i % 3}_prod", timestamp=now - (i % 6) * 86_400)
    for i in range(6):
        push(server, f"bulk 批量 cleanup candidate {i}", source="bulk_cleanup_v1")
    wait_searchable(server, "订单", [w["question"], w["tool"], w["thinking"], w["hostile"], w["forget_me"]])
    return w


@pytest.fixture(scope="module")
def browser():
    from selenium import webdriver
    from selenium.webdriver.chrome.service import Service
    os.environ.setdefault("SE_OFFLINE", "true")          # never let Selenium fetch a browser or driver
    options = webdriver.ChromeOptions()
    options.binary_location = CHROMIUM
    for arg in ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--disable-gpu",
                f"--window-size={WIDE[0]},{WIDE[1]}", "--lang=en-US", "--no-first-run", "--disable-extensions"):
        options.add_argument(arg)
    options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    driver = webdriver.Chrome(options=options, service=Service(CHROMEDRIVER))
    driver.set_page_load_timeout(60)
    try:
        yield driver
    finally:
        driver.quit()


class Console:
    """The console in one browser tab: waits, finds, and screenshots."""

    def __init__(self, driver, server, shots):
        from selenium.webdriver.support.ui import WebDriverWait
        self.d, self.server, self.shots = driver, server, shots
        self.wait = WebDriverWait(driver, 20)

    def open(self, route=""):
        """Load the console afresh (a new document, as a reload: this tab's session storage stays)."""
        self.d.get("about:blank")
        self.d.get(self.server.url + "/console/" + route)
        self.wait.until(lambda d: d.execute_script("return document.body.dataset.booted === '1'"))

    def renders(self) -> int:
        return int(self.d.execute_script("return document.body.dataset.renders || '0'"))

    def go(self, route):
        """Switch to a route and wait until the console has drawn it."""
        before = self.renders()
        self.d.execute_script("location.hash = arguments[0]", route)
        self.until(lambda: self.renders() > before, f"route {route} was not drawn")

    def find(self, css, timeout=None):
        from selenium.webdriver.common.by import By
        from selenium.webdriver.support.ui import WebDriverWait
        wait = self.wait if timeout is None else WebDriverWait(self.d, timeout)
        return wait.until(lambda d: d.find_element(By.CSS_SELECTOR, css))

    def all(self, css):
        from selenium.webdriver.common.by import By
        return self.d.find_elements(By.CSS_SELECTOR, css)

    def until(self, fn, message=""):
        return self.wait.until(lambda d: fn(), message)

    def text(self, css):
        return self.find(css).get_attribute("textContent")

    def shot(self, name, max_height=1600):
        """A screenshot of the whole page (up to ``max_height`` px), at the current width."""
        size = self.d.get_window_size()
        chrome = size["height"] - self.d.execute_script("return window.innerHeight")
        page = self.d.execute_script("return document.documentElement.scrollHeight")
        self.d.set_window_size(size["width"], min(max_height, max(size["height"], page + chrome)))
        try:
            self.d.save_screenshot(str(self.shots / f"{name}.png"))
        finally:
            self.d.set_window_size(size["width"], size["height"])

    def sign_in(self, key):
        self.open()
        field = self.find("#key-input")
        field.clear()
        field.send_keys(key + "\n")                    # Enter submits: no mouse needed
        self.find("#search-q")

    def no_alert(self):
        from selenium.common.exceptions import NoAlertPresentException
        try:
            text = self.d.switch_to.alert.text
        except NoAlertPresentException:
            return True
        raise AssertionError(f"an alert opened: {text!r}")

    def errors(self, expected=()):
        """Browser console errors, except the 401 of the sign-in check before signing in (and ``expected``)."""
        return [e for e in self.d.get_log("browser") if e["level"] == "SEVERE"
                and not any(x in e["message"] for x in ("/console/session", *expected))]


@pytest.fixture
def ui(browser, server, shots, world):
    browser.set_window_size(*WIDE)
    c = Console(browser, server, shots)
    c.open()
    browser.execute_script("sessionStorage.clear(); localStorage.clear()")
    browser.get_log("browser")                          # start each test with an empty log
    return c


def test_sign_in_keeps_the_key_in_session_storage_only(ui):
    ui.open()
    ui.find("#key-input").send_keys("wrong-key-0123456789abcdef\n")
    ui.until(lambda: "not accepted" in ui.text("#status"))
    assert ui.d.execute_script("return sessionStorage.length") == 0
    ui.shot("01-sign-in")
    ui.sign_in(ADMIN)
    assert ui.text("#tenant") == "acme"
    assert ui.d.execute_script("return sessionStorage.getItem('context-mode.key')") == ADMIN
    assert ui.d.execute_script("return document.cookie") == "" and ui.d.get_cookies() == []
    assert ADMIN not in ui.d.current_url
    assert ui.d.execute_script("return localStorage.getItem('context-mode.key')") is None
    # a reload in the same tab stays signed in; signing out forgets the key
    ui.open("#/units")
    ui.find("#unit-list li")
    ui.find("#signout").click()
    ui.find("#key-input")
    assert ui.d.execute_script("return sessionStorage.getItem('context-mode.key')") is None
    assert ui.errors() == []


def test_search_in_chinese_with_highlights_badges_and_the_consistency_toggle(ui, world):
    ui.sign_in(ADMIN)
    ui.find("#search-q").send_keys("订单 发货")
    ui.find("#search-strong").click()                   # strong consistency: read-your-writes
    ui.find("#search-submit").click()
    ui.find("#search-results li.result")
    assert "consistency=strong" in ui.d.current_url
    cards = ui.all("#search-results li.result")
    found = [c.get_attribute("data-cid") for c in cards]
    assert set(found) >= {world["question"], world["tool"], world["thinking"]}
    first = cards[0]
    marks = [m.text for m in first.find_elements("css selector", "mark")]
    assert marks and set(marks) <= {"订单", "发货"}
    assert first.find_element("css selector", ".badge.score").text.startswith("score 0.")
    assert first.find_element("css selector", ".badge").text in ("user_input", "tool_output", "model_thinking",
                                                                   "system_notice")
    ui.shot("02-search")
    # filters: only model_thinking
    ui.go("#/search?q=%E8%AE%A2%E5%8D%95&types=model_thinking")
    ui.until(lambda: [c.get_attribute("data-cid") for c in ui.all("#search-results li.result")] == [world["thinking"]])
    assert ui.errors() == []


def test_unit_page_shows_fields_countdown_and_lineage_links(ui, world):
    ui.sign_in(ADMIN)
    ui.go("#/search?q=%E5%BF%AB%E9%80%92%E5%8D%95%E5%8F%B7")          # 快递单号
    ui.find(f'#search-results li.result[data-cid="{world["thinking"]}"] a.cid').click()
    ui.until(lambda: ui.text("#unit-cid") == world["thinking"])
    assert ui.text("#unit-content").startswith("订单已经发货")
    first = ui.text("#expires")
    assert "in 59m" in first or "in 1h" in first
    time.sleep(1.2)
    assert ui.text("#expires") != first                 # the countdown ticks
    links = [a.text for a in ui.all("#lineage li.ancestor > .node a.cid")]
    assert links == [world["question"], world["tool"]]   # root first
    ui.find(f'#lineage a[href="#/unit/{world["tool"]}"]').click()
    ui.until(lambda: ui.text("#unit-cid") == world["tool"])
    assert '"http_status": 200' in ui.text("#unit-metadata")
    assert [a.text for a in ui.all("#children a.cid")] == [world["thinking"]]
    ui.shot("03-unit-lineage")
    assert ui.errors() == []


def test_a_hostile_unit_stays_inert(ui, world):
    ui.sign_in(ADMIN)
    def inert():
        time.sleep(0.3)
        ui.no_alert()
        assert ui.d.execute_script("return window.__pwned") is None
        assert ui.all("main img") == [] and ui.all("main script") == [] and ui.all("main [onerror], main [onmouseover]") == []
        assert ui.all('a[href^="javascript"]') == []
        assert all(a.get_attribute("href").split("#", 1)[1].startswith("/") for a in ui.all("main a"))
        assert ui.d.execute_script("return document.scripts.length") == 1
    ui.go("#/search?q=HOSTILE")
    card = ui.find(f'#search-results li.result[data-cid="{world["hostile"]}"]')
    assert "<a href=\"javascript:alert(4)\">" in card.text        # the markup shows as text
    inert()
    ui.go("#/units?source=%3Cb*")
    assert [li.get_attribute("data-cid") for li in ui.all("#unit-list li")] == [world["hostile"]]
    inert()
    ui.go(f"#/unit/{world['hostile']}")
    assert ui.text("#unit-content") == HOSTILE            # shown exactly, as text
    assert ui.text("#unit-source") == '<b onmouseover="alert(5)">evil</b>_v1'
    assert "<img src=x onerror=alert(6)>" in ui.text("#unit-metadata")
    inert()
    ui.shot("04-hostile-unit")
    assert ui.errors() == []


def test_list_scrolls_for_more_and_filters(ui, world):
    ui.sign_in(READER)
    ui.find("#nav-units").click()
    # (at least the first page: on a slow machine the list may already have asked for the next one when looked at)
    ui.until(lambda: len(ui.all("#unit-list li")) >= 50)
    assert ui.all("#nav-forget") == []                  # a key without the admin scope cannot forget
    ui.d.execute_script("window.scrollTo(0, document.body.scrollHeight)")
    ui.until(lambda: len(ui.all("#unit-list li")) > 50)
    ui.until(lambda: "No more units" in ui.text("#list-note"))
    assert len(ui.all("#unit-list li")) == len(set(li.get_attribute("data-cid") for li in ui.all("#unit-list li")))
    ui.go("#/units?types=system_notice&source=ci_runner*")
    ui.until(lambda: len(ui.all("#unit-list li")) == 35 and "No more units" in ui.text("#list-note"))
    assert {li.find_element("css selector", ".badge").text for li in ui.all("#unit-list li")} == {"system_notice"}
    ui.go("#/units")
    ui.find("#unit-list li")
    ui.shot("05-units")
    ui.go(f"#/unit/{world['notice']}")
    ui.find("#unit-content")
    assert ui.all("#forget-unit") == []
    assert ui.errors() == []


def test_timeline_chart_and_stats(ui):
    ui.sign_in(ADMIN)
    ui.find("#nav-timeline").click()
    ui.find("#chart")
    stats = requests.get(ui.server.url + "/mcp/stats", headers=ui.server.headers(ADMIN), timeout=30).json()
    assert ui.text("#stat-units") == str(stats["units"])
    # the live streams the tenant holds over every worker, of the most it may (issue 51)
    assert ui.text("#stat-streams") == f"{stats['streams']['open']} / {stats['streams']['tenant_limit']}"
    bars = ui.all("#chart rect")
    assert len(bars) == sum(len(d["types"]) for d in stats["days"])
    assert {b.get_attribute("data-type") for b in bars} == set(stats["types"])
    assert [r.text.split()[0] for r in ui.all("#type-table tbody tr")] == sorted(stats["types"])
    ui.shot("06-timeline")
    assert ui.errors() == []


def test_forget_one_unit_and_it_is_gone_from_search(ui, server, world):
    ui.sign_in(ADMIN)
    ui.go("#/search?q=scratch")
    ui.find(f'#search-results li.result[data-cid="{world["forget_me"]}"]')
    ui.go(f"#/unit/{world['forget_me']}")
    ui.find("#forget-unit").click()
    confirm = ui.find("#forget-unit-confirm")
    assert ui.d.switch_to.active_element == confirm     # focus moves to the decision
    confirm.send_keys("\n")                             # the keyboard confirms
    ui.until(lambda: "Forgotten 1 unit" in ui.text("#status"))
    assert ui.d.current_url.endswith("#/units")
    # the default search (the read index, whichever worker answers) no longer shows it, right away
    for _ in range(4):
        ui.go("#/search?q=scratch&n=" + str(time.monotonic_ns()))
        ui.until(lambda: ui.all("#search-summary"))
        assert world["forget_me"] not in [c.get_attribute("data-cid") for c in ui.all("#search-results li.result")]
    ui.go(f"#/unit/{world['forget_me']}")
    ui.find("#unit-missing")
    assert ui.errors(expected=[f"/mcp/units/{world['forget_me']}/lineage - Failed to load resource: the server "
                               "responded with a status of 404"]) == []


def test_bulk_forget_counts_first_then_forgets(ui, server):
    ui.sign_in(ADMIN)
    ui.find("#nav-forget").click()
    ui.find("#forget-q").send_keys("cleanup")
    source = ui.find("#forget-form input[name=source]")
    source.send_keys("bulk_cleanup*")
    ui.find("#forget-submit").click()
    ui.until(lambda: ui.all("#forget-count"))
    assert ui.text("#forget-count") == "6 units match."
    assert len(ui.all("#forget-result li")) == 6
    left = requests.get(server.url + "/mcp/units", params={"source": "bulk_cleanup*"}, headers=server.headers(ADMIN),
                        timeout=30).json()["units"]
    assert len(left) == 6                               # the dry run forgot nothing
    ui.shot("07-forget-dry-run")
    ui.find("#forget-confirm").click()
    ui.until(lambda: ui.all("#forget-done"))
    assert ui.text("#forget-done") == "Forgotten 6 unit(s)."
    left = requests.get(server.url + "/mcp/units", params={"source": "bulk_cleanup*"}, headers=server.headers(ADMIN),
                        timeout=30).json()["units"]
    assert left == []
    assert ui.errors() == []


def test_a_link_to_a_forget_dry_run_waits_for_a_click(ui, server):
    """Issue 39, low 11: #/forget?run=…&… (a link someone sent) fills the form in and runs nothing; the dry run
    waits for the button, and a reload of the address it left runs nothing either."""
    for i in range(2):
        push(server, f"linked 链接 sweep candidate {i}", source="link_sweep_v1")

    def forget_calls():
        return server.log(tail=None).count("route=/mcp/forget ")
    ui.sign_in(ADMIN)
    before = forget_calls()
    ui.go("#/forget?run=1&q=sweep&source=link_sweep*")
    ui.until(lambda: ui.d.execute_script("return document.querySelector('main').dataset.ready") == "forget")
    assert ui.find("#forget-q").get_attribute("value") == "sweep"
    assert ui.find("#forget-form input[name=source]").get_attribute("value") == "link_sweep*"
    time.sleep(1)
    assert ui.all("#forget-count") == [] and ui.all("#forget-confirm") == []
    assert forget_calls() == before                     # no request left the page
    ui.find("#forget-submit").click()
    ui.until(lambda: ui.all("#forget-count"))
    assert ui.text("#forget-count") == "2 units match."
    ui.until(lambda: forget_calls() == before + 1)          # (access lines are written in batches, up to 50 ms late)
    ui.open(ui.d.execute_script("return location.hash"))      # the address the click left, loaded again
    ui.until(lambda: ui.d.execute_script("return document.querySelector('main').dataset.ready") == "forget")
    time.sleep(1)
    assert ui.all("#forget-count") == [] and forget_calls() == before + 1
    assert ui.errors() == []


def test_keyboard_and_the_chinese_interface(ui, world):
    from selenium.webdriver.common.action_chains import ActionChains
    from selenium.webdriver.common.keys import Keys
    ui.sign_in(ADMIN)
    ui.go("#/units")
    ui.find("#unit-list li")
    body = ui.find("body")
    body.send_keys("/")
    ui.until(lambda: ui.d.switch_to.active_element.get_attribute("id") == "search-q")
    ui.d.switch_to.active_element.send_keys("部署\n")
    ui.find(f'#search-results li.result[data-cid="{world["notice"]}"]')
    ui.find("h1").click()
    ActionChains(ui.d).send_keys("g").send_keys("t").perform()
    ui.find("#chart")
    # on a freshly loaded page the first Tab reaches the skip link, which leads into the page
    ui.open("#/units")
    ui.find("#unit-list li")
    ActionChains(ui.d).send_keys(Keys.TAB).perform()
    assert ui.d.switch_to.active_element.get_attribute("id") == "skip-link", \
        ui.d.switch_to.active_element.get_attribute("outerHTML")[:200]
    ActionChains(ui.d).send_keys(Keys.ENTER).perform()
    ui.until(lambda: ui.d.switch_to.active_element.get_attribute("id") == "main")
    ui.find("#lang").click()
    ui.until(lambda: ui.text("#nav-search") == "搜索")
    assert ui.d.execute_script("return document.documentElement.lang") == "zh-CN"
    ui.go("#/search?q=%E8%AE%A2%E5%8D%95")
    ui.find("#search-results li.result")
    assert "条结果" in ui.text("#search-summary")
    ui.shot("08-search-zh")
    ui.find("#lang").click()
    ui.until(lambda: ui.text("#nav-search") == "Search")
    assert ui.errors() == []


def test_the_console_at_375_px(ui, world):
    ui.d.set_window_size(*NARROW)
    ui.sign_in(ADMIN)
    width = ui.d.execute_script("return window.innerWidth")
    assert 340 <= width <= 400, width

    def fits():
        return ui.d.execute_script("return document.documentElement.scrollWidth <= window.innerWidth")
    for route, ready in (("#/search?q=%E8%AE%A2%E5%8D%95%20%E5%8F%91%E8%B4%A7", "#search-results li.result"),
                         (f"#/unit/{world['tool']}", "#lineage"), ("#/units", "#unit-list li"),
                         ("#/timeline", "#chart"), ("#/forget", "#forget-form")):
        ui.go(route)
        ui.find(ready)
        assert fits(), route
        name = {"#/s": "09-narrow-search", "#/u": "10-narrow-unit", "#/t": "11-narrow-timeline"}.get(route[:3])
        if name and not (route.startswith("#/units")):
            ui.shot(name)
    # everything stays reachable: the folded filters open and the search still works
    ui.go("#/search")
    ui.find("#search-filters summary").click()
    assert ui.find("#search-filters input[name=source]").is_displayed()
    ui.find("#search-q").send_keys("订单\n")
    ui.find("#search-results li.result")
    assert fits()
    assert ui.errors() == []


def test_no_keys_mode_on_loopback_opens_directly(browser, shots, tmp_path):
    server = LiveServer(tmp_path / "open", workers=1).start()
    try:
        requests.post(server.url + "/mcp/push", json=make_unit("开放模式 open mode unit"), timeout=30)
        c = Console(browser, server, shots)
        browser.set_window_size(*WIDE)
        c.open("#/units")
        assert c.all("#key-input") == []
        c.find("#unit-list li")
        assert c.text("#tenant") == "default" and "(no keys configured, loopback only)" in c.text("#who")
        assert c.text("#who").count("(") == 1                      # it read "(no keys configured (loopback))"
        assert "order they arrived" in c.text("#units-order")       # not "newest first" by timestamp (issue 26)
        assert c.all("#signout") == [] and c.all("#nav-forget") != []
    finally:
        server.stop()
