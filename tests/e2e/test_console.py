"""The operator console in a real browser (Debian's headless chromium driven by Selenium).

One router streams a slot into two routes (a plain table route and a filtered publication
route, ``[console]`` with a token and actions on); the page it serves at ``/`` is read as a
person would read it and compared with what Kafka and PostgreSQL hold: records per route, the
filter's drops, the slot's lag growing while a prepared transaction holds confirmation and
falling after it commits, a backfill started from the page with its progress bar advancing.
A second router whose Kafka address is a proxy the test closes shows the error and clears it
when Kafka is back; ``pgrouter console`` shows both routers. Credentials: none or a wrong token
is 401, and no secret of the config reaches the page or ``/api/status``. A screenshot is saved
(``PGROUTER_ARTIFACTS``, default ``.devstack/artifacts``).
"""

from __future__ import annotations

import json
import os
import pathlib
import subprocess
import sys
import urllib.error
import urllib.request

import msgspec
import pytest

from tests.e2e.console_browser import TOKEN, free_port, http, stop, wait_for, with_token
from tests.e2e.console_schema import RunStatus
from tests.e2e.guarantee import delete_topics
from tests.e2e.tcp_proxy import PausableProxy
from tests.helpers import ROOT, Pg, read_topic, start_router, unique, write_config

pytestmark = pytest.mark.services

DSN_PASSWORD = "dsn-secret-91ab"
SASL_PASSWORD = "sasl-secret-27cd"
SECRETS = (TOKEN, DSN_PASSWORD, SASL_PASSWORD)
BACKFILL_ROWS = 12_000
ARTIFACTS = pathlib.Path(os.environ.get("PGROUTER_ARTIFACTS", ROOT / ".devstack" / "artifacts"))


class Stack(msgspec.Struct):
    pg: Pg
    name: str
    port: int
    proc: subprocess.Popen
    log: pathlib.Path
    topics: list

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"


@pytest.fixture(scope="module")
def stack(pg_dsn, kafka_bootstrap, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("console")
    pg = Pg(pg_dsn)
    name = unique("con")
    pg.run(f"create table {name}_a (id int primary key, v int, pad text)")
    pg.run(f"create table {name}_b (id int primary key, payload text)")
    pg.run(f"insert into {name}_b select i, md5(i::text) from generate_series(1, "
           f"{BACKFILL_ROWS}) i")
    pg.run(f"analyze {name}_b")
    pg.run(f"create publication {name}_src for table {name}_a, {name}_b")
    pg.run(f"create publication {name}_big for table {name}_a (id, v) where (v > 10) "
           "with (publish = 'insert')")
    port = free_port()
    dsn = pg_dsn.replace("postgresql://postgres@", f"postgresql://postgres:{DSN_PASSWORD}@")
    assert DSN_PASSWORD in dsn, "the test DSN has no user@ part to put a password in"
    cfg = write_config(
        tmp / "router.toml", dsn=dsn, slot=name, publications=[f"{name}_src"],
        bootstrap=kafka_bootstrap, source_extra="two_phase = true",
        kafka_extra=f'[kafka.settings]\nsasl_plain_password = "{SASL_PASSWORD}"\n',
        routes=f"""
[[routes]]
name = "{name}_all"
tables = ["public.{name}_a", "public.{name}_b"]

[[routes]]
name = "{name}_big"
publication = "{name}_big"
""", extra=f"""
[metrics]
listen = "127.0.0.1:{port}"
sample_interval = 0.3

[console]
token = "{TOKEN}"
allow_actions = true

[snapshot]
mode = "never"
chunk_rows = 100
""")
    log = tmp / "router.log"
    proc = start_router(cfg, log)
    topics = [f"{name}_{r}.public.{name}_{t}" for r in ("all", "big") for t in ("a", "b")]
    s = Stack(pg=pg, name=name, port=port, proc=proc, log=log, topics=topics)
    try:
        wait_for(lambda: http(s.url + "/readyz")[0] == 200, "the router streaming", 60)
        yield s
    finally:
        stop(proc)
        for (gid,) in pg.run("select gid from pg_prepared_xacts where gid like %s", f"{name}%"):
            pg.run(f"rollback prepared '{gid}'")
        pg.drop_slot(name)
        pg.drop_slot(f"{name}_2")
        pg.run(f"drop publication if exists {name}_src, {name}_big")
        pg.run(f"drop table if exists {name}_a, {name}_b")
        pg.close()
        delete_topics(kafka_bootstrap, topics)


@pytest.fixture
def page(stack, browser):
    with_token(browser, TOKEN)
    browser.get(stack.url + "/")
    wait_for(lambda: shown(browser)["ready"] == "true", "the page showing a streaming router")
    return browser


SHOWN = """
const byId = (id) => document.getElementById(id);
const routes = {};
for (const tr of document.querySelectorAll('#routes tbody tr'))
  routes[tr.dataset.route] = {records: +tr.querySelector('.records').dataset.value,
                              dropped: +tr.querySelector('.dropped').dataset.value,
                              carries: tr.querySelector('.carries').textContent};
const jobs = [...document.querySelectorAll('#jobs tbody tr')].map((tr) => ({
  table: tr.dataset.table, kind: tr.dataset.kind,
  percent: tr.dataset.percent === '' ? null : +tr.dataset.percent,
  width: tr.querySelector('.bar > div').style.width,
  rows: +tr.querySelector('.rows').dataset.value}));
return {routes, jobs, lag: byId('slot-lag-bytes').dataset.value,
        in_flight: byId('kafka-in-flight').dataset.value,
        problem: !byId('problem').hidden, problem_text: byId('problem-text').textContent,
        ready: byId('state').dataset.ready, spark: byId('spark-line').getAttribute('points'),
        log: [...document.querySelectorAll('#log li')].map((li) => li.textContent)};
"""


def shown(driver) -> dict:
    """What the page shows right now (read from its DOM, as rendered)."""
    return driver.execute_script(SHOWN)


def test_credentials_and_no_secret_in_the_page(stack, browser):
    for path in ("/", "/api/status", "/metrics"):
        assert http(stack.url + path, token=None)[0] == 401, path
        assert http(stack.url + path, token="wrong")[0] == 401, path
    assert http(stack.url + "/healthz", token=None)[0] == 200
    with_token(browser, None)
    browser.get(stack.url + "/")
    assert "credentials needed" in browser.page_source
    with_token(browser, "wrong")
    browser.get(stack.url + "/")
    assert "credentials needed" in browser.page_source
    with_token(browser, TOKEN)
    browser.get(stack.url + "/")
    wait_for(lambda: shown(browser)["ready"] == "true", "the page rendering the status")
    # light and fast: the page paints within 300 ms of its request from a local router (a
    # warm browser: its first start is not the page's; the best of three loads, as this
    # machine is shared)
    paints = []
    for _ in range(3):
        browser.refresh()
        paints.append(wait_for(lambda: browser.execute_script(
            "const p = performance.getEntriesByName('first-contentful-paint');"
            "return p.length ? p[0].startTime : null;"), "the first paint", 10))
    assert min(paints) < 300, paints
    wait_for(lambda: shown(browser)["ready"] == "true", "the page rendering the status")
    source = browser.page_source
    assert f"{stack.name}_big" in source and "postgres:***@" in source  # the config is shown
    status, body = http(stack.url + "/api/status")
    assert status == 200
    for secret in SECRETS:
        assert secret not in source, f"{secret} in the page"
        assert secret.encode() not in body, f"{secret} in /api/status"


def test_status_schema(stack):
    status, body = http(stack.url + "/api/status")
    doc = msgspec.json.decode(body, type=RunStatus)  # every field typed, none unknown
    assert (doc.schema, doc.kind, doc.name) == (1, "run", stack.name)
    assert doc.kafka.delivery == "at-least-once" and doc.actions.backfill and doc.csrf
    assert [r.name for r in doc.routes] == [f"{stack.name}_all", f"{stack.name}_big"]
    big = doc.routes[1]
    # the publication's filter and column list as PostgreSQL prints them
    assert big.source == {"publications": [f"{stack.name}_big"]}
    assert [(t.table, t.row_filter, t.columns) for t in big.tables] == [
        (f"public.{stack.name}_a", "(v > 10)", ["id", "v"])]
    assert doc.slot.wal_status == "reserved" and doc.slot.active is True


def test_the_page_shows_what_kafka_holds(stack, page, kafka_bootstrap):
    pg, n = stack.pg, stack.name
    pg.run(f"insert into {n}_a select i, i from generate_series(1, 40) i")
    pg.run(f"update {n}_a set v = v + 1 where id <= 20")
    pg.run(f"delete from {n}_a where id > 35")
    # 40 + 20 + 5 changes for the plain route; the filtered one takes the 30 inserts with
    # v > 10 and drops 10 inserts, 20 updates and 5 deletes (not among its actions)
    view = wait_for(lambda: (v := shown(page))["routes"][f"{n}_all"]["records"] >= 65
                    and v["routes"][f"{n}_big"]["dropped"] >= 35 and v["in_flight"] == "0"
                    and v, "the page counting every record", 30)
    all_a = read_topic(kafka_bootstrap, f"{n}_all.public.{n}_a")
    big_a = read_topic(kafka_bootstrap, f"{n}_big.public.{n}_a")
    assert (len(all_a), len(big_a)) == (65, 30)
    assert view["routes"][f"{n}_all"]["records"] == len(all_a)
    assert view["routes"][f"{n}_big"]["records"] == len(big_a)
    assert view["routes"][f"{n}_big"]["dropped"] == 35
    assert view["routes"][f"{n}_all"]["dropped"] == 0
    assert f"public.{n}_a (id, v) WHERE (v > 10)" in view["routes"][f"{n}_big"]["carries"]


def test_lag_grows_while_confirmation_is_held_and_falls_after(stack, page):
    """A prepared transaction holds the router's confirmation (two_phase): the WAL written
    after it is lag the server counts, the page shows it growing, and falling once the
    transaction commits."""
    pg, n = stack.pg, stack.name
    gid = f"{n}_held"
    pg.run(f"begin; insert into {n}_a values (100000, 1); prepare transaction '{gid}'")
    readings = []
    for round_ in range(3):
        pg.run(f"insert into {n}_a select i, 0, repeat('x', 200) from generate_series("
               f"{200000 + round_ * 3000}, {200000 + round_ * 3000 + 2999}) i")
        before = readings[-1] if readings else 0
        readings.append(wait_for(lambda: (lag := int(shown(page)["lag"] or 0)) > before
                                 and lag, f"the lag shown above {before}", 20))
    assert readings == sorted(readings) and readings[-1] > readings[0] + 500_000, readings
    pg.run(f"commit prepared '{gid}'")
    wait_for(lambda: int(shown(page)["lag"] or 0) < 100_000, "the lag shown falling", 30)
    points = shown(page)["spark"].split()
    assert len(points) >= 3  # the sparkline has the hour's points, the peak at the top
    assert min(float(p.split(",")[1]) for p in points) < 5


def test_a_backfill_started_from_the_page_advances(stack, page, kafka_bootstrap):
    from selenium.webdriver.common.by import By

    n = stack.name
    status, body = http(stack.url + "/api/backfill")  # GET: not an action
    assert status == 405
    button = page.find_element(By.CSS_SELECTOR, f'tr[data-route="{n}_all"] button.backfill')
    button.click()
    page.switch_to.alert.accept()
    seen: list[float] = []

    def finished():
        jobs = [j for j in shown(page)["jobs"] if j["table"] == f"public.{n}_b"
                and j["kind"] == "backfill"]
        if jobs and jobs[0]["percent"] is not None:
            if not seen or jobs[0]["percent"] != seen[-1]:
                seen.append(jobs[0]["percent"])
            return jobs[0]["percent"] == 100 and jobs[0]
        return None
    job = wait_for(finished, "the backfill's progress bar reaching 100 %", 60, every=0.1)
    assert job["rows"] == BACKFILL_ROWS and job["width"] == "100%"
    middle = [p for p in seen if 0 < p < 100]
    assert len(middle) >= 2 and middle == sorted(middle), seen  # it advanced, never back
    records = read_topic(kafka_bootstrap, f"{n}_all.public.{n}_b")
    assert len(records) == BACKFILL_ROWS and {r["value"]["op"] for r in records} == {"r"}
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    page.execute_script("document.querySelector('details').open = true")
    assert page.save_screenshot(str(ARTIFACTS / "console.png"))
    print(f"screenshot: {ARTIFACTS / 'console.png'}")

    # what the page got refused comes back as the problems `pgrouter snapshot` prints
    csrf = json.loads(http(stack.url + "/api/status")[1])["csrf"]
    req = urllib.request.Request(
        stack.url + "/api/backfill", data=json.dumps({"routes": ["no_such_route"]}).encode(),
        headers={"Authorization": f"Bearer {TOKEN}", "X-CSRF-Token": csrf,
                 "Content-Type": "application/json"})
    with pytest.raises(urllib.error.HTTPError) as refused:
        urllib.request.urlopen(req, timeout=30)
    assert refused.value.code == 400
    assert "no_such_route" in " ".join(json.loads(refused.value.read())["problems"])


def test_a_phone_width_needs_no_sideways_scrolling(stack, page):
    page.set_window_size(390, 844)
    try:
        page.get(stack.url + "/")
        wait_for(lambda: shown(page)["ready"] == "true", "the page on a phone width")
        wide = page.execute_script(
            "return [document.documentElement.scrollWidth, window.innerWidth]")
        assert wide[0] <= wide[1], wide
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        page.save_screenshot(str(ARTIFACTS / "console-phone.png"))
    finally:
        page.set_window_size(1280, 1400)


def test_kafka_unreachable_then_back_and_the_overview(stack, browser, pg_dsn, kafka_bootstrap,
                                                      tmp_path):
    host, _, kport = kafka_bootstrap.rpartition(":")
    proxy = PausableProxy((host, int(kport)), start_open=False)  # Kafka unreachable
    n, port2, port3 = stack.name, free_port(), free_port()
    cfg = write_config(
        tmp_path / "two.toml", dsn=pg_dsn, slot=f"{n}_2", publications=[f"{n}_src"],
        bootstrap=f"127.0.0.1:{proxy.port}",
        routes=f'[[routes]]\nname = "{n}_two"\ntables = ["public.{n}_a"]\n',
        extra=f'[metrics]\nlisten = "127.0.0.1:{port2}"\n[snapshot]\nmode = "never"\n')
    stack.topics.append(f"{n}_two.public.{n}_a")  # dropped with the others
    two = start_router(cfg, tmp_path / "two.log")
    (tmp_path / "token").write_text(TOKEN + "\n")
    overview = subprocess.Popen(
        [sys.executable, "-m", "actors.cli", "console", "--router", stack.url,
         "--router", f"http://127.0.0.1:{port2}", "--token-file", str(tmp_path / "token"),
         "--listen", f"127.0.0.1:{port3}"], cwd=ROOT, start_new_session=True,
        stdout=subprocess.DEVNULL, stderr=open(tmp_path / "console.log", "ab"))
    try:
        wait_for(lambda: http(f"http://127.0.0.1:{port2}/healthz")[0] == 200, "router two", 30)
        wait_for(lambda: http(f"http://127.0.0.1:{port3}/healthz")[0] == 200, "the overview", 30)
        with_token(browser, None)  # the second router asks for no credentials
        browser.get(f"http://127.0.0.1:{port2}/")
        view = wait_for(lambda: (v := shown(browser))["problem"] and v, "the error shown", 45)
        assert view["ready"] == "false" and "Kafka not reachable" in view["problem_text"]
        assert any("Kafka not reachable" in line for line in view["log"])

        with_token(browser, TOKEN)  # asks the overview, which asks the routers with it
        browser.get(f"http://127.0.0.1:{port3}/")
        cards = wait_for(lambda: overview_cards(browser), "the overview", 20)
        one = json.loads(http(stack.url + "/api/status")[1])
        assert cards[stack.url]["ok"] == "true"
        assert cards[stack.url]["routes"] == {r["name"]: r["records"] for r in one["routes"]}
        assert cards[f"http://127.0.0.1:{port2}"]["ok"] == "false"

        proxy.open()  # Kafka is back: the router streams and the error clears
        with_token(browser, None)
        browser.get(f"http://127.0.0.1:{port2}/")
        view = wait_for(lambda: (v := shown(browser))["ready"] == "true" and v,
                        "the router streaming again", 45)
        assert not view["problem"]
        with_token(browser, TOKEN)
        browser.get(f"http://127.0.0.1:{port3}/")
        cards = wait_for(lambda: (c := overview_cards(browser)) and all(
            x["ok"] == "true" for x in c.values()) and c, "both routers healthy", 20)
        assert len(cards) == 2
    finally:
        stop(overview)
        stop(two)
        proxy.close()
        with_token(browser, TOKEN)


def overview_cards(driver) -> dict:
    return driver.execute_script("""
      const out = {};
      for (const sec of document.querySelectorAll('#routers section')) {
        const routes = {};
        for (const tr of sec.querySelectorAll('tr[data-route]'))
          routes[tr.dataset.route] = +tr.querySelector('.records').dataset.value;
        out[sec.dataset.url] = {ok: sec.dataset.ok, routes};
      }
      return Object.keys(out).length ? out : null;""")
