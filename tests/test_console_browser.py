"""The admin console in a real browser (Debian's headless Chromium via Playwright) against
the real gunicorn started as `make run` starts it (tests/support/web.py): assets served by
WhiteNoise and applied, API docs offline, login form, changelist search/filters/actions, the change
form's live cron preview (the only JavaScript of ours), the dead-letter queue and the
operations dashboard. The Django test client sees none of the JS, CSS or real form posts.
"""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta

import pytest
import requests
from django.db import transaction
from django.utils import timezone
from playwright.sync_api import expect

from jobs import services, tenant_services
from jobs.admin.display import duration_text, in_zone
from jobs.dispatch import planning
from jobs.models import AuditEntry, Job, SchedulerNode, Tenant
from runs.enqueue import enqueue_runs
from runs.keys import format_utc
from runs.models import JobRun, JobRunRow
from tests.support import browser as b
from tests.support import nodes

HOOK = {"type": "http", "url": "https://example.com/hook"}


@pytest.fixture(scope="module")
def chromium():
    with b.chromium() as browser:
        yield browser


@pytest.fixture
def page(chromium, web_server, transactional_db):
    """A fresh context (no cookies) per test; fails the test on a JS error, a missing asset
    or a request to any host but 127.0.0.1. The server is another process: what a test
    writes must be committed, hence transactional_db. Its workers start fresh too: they
    must not keep ids (content types) from before the last test's flush."""
    web_server.fresh_workers()
    context = chromium.new_context(viewport=b.VIEWPORT, base_url=web_server.url)
    context.set_default_timeout(b.TIMEOUT_MS)
    page = context.new_page()
    problems = b.PageProblems()
    problems.watch(page)
    yield page
    context.close()
    assert problems.js_errors == [], problems.js_errors
    assert problems.failed_assets == [], problems.failed_assets
    assert problems.foreign_requests == [], problems.foreign_requests


@pytest.fixture
def signed_in(page, web_server, admin_user):
    b.log_in(page, web_server.url, "admin", "password")
    expect(page.locator("#site-name")).to_be_visible()
    return page


@pytest.fixture
def acme(transactional_db):
    tenant, _ = tenant_services.create_tenant(slug="acme", name="Acme", max_concurrency=2)
    return tenant


def enqueue(job: Job, *slots: datetime) -> list[JobRun]:
    with transaction.atomic():
        enqueue_runs(
            [planning.run_for(job, scheduled_at=s, trigger="schedule", overlap_check=False) for s in slots]
        )
    return list(JobRun.objects.filter(job_id=job.id, scheduled_at__in=slots).order_by("scheduled_at"))


def minutes_ago(*minutes: int) -> list[datetime]:
    top = datetime.now(UTC).replace(second=0, microsecond=0)
    return [top - timedelta(minutes=m) for m in minutes]


def next_daily(now: datetime, hour: int, minute: int, weekday: int | None = None) -> datetime:
    """First hour:minute UTC strictly after `now` (on `weekday`, Monday=0, if given)."""
    at = now.replace(hour=hour, minute=minute, second=0, microsecond=0)
    while at <= now or (weekday is not None and at.weekday() != weekday):
        at += timedelta(days=1)
    return at


def z(dt: datetime) -> str:
    return dt.astimezone(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_stylesheets_apply_through_gunicorn(page, web_server, admin_user):
    """The login page and the admin are styled by files gunicorn itself serves: hashed
    names from the manifest (cacheable forever), gzip on request, and applied by the browser."""
    page.goto("/admin/login/")
    # A stylesheet that did not apply leaves the header transparent and the login box unstyled.
    header_bg = page.locator("#header").evaluate("e => getComputedStyle(e).backgroundColor")
    assert header_bg not in ("rgba(0, 0, 0, 0)", "transparent"), header_bg
    # Unstyled, the theme toggle's label shows as text and the login box spans the window.
    hidden = page.locator(".theme-toggle .visually-hidden").first
    assert hidden.evaluate("e => getComputedStyle(e).position") == "absolute"
    assert page.locator("#container").bounding_box()["width"] < b.VIEWPORT["width"] / 2

    css = page.locator("link[rel=stylesheet]").evaluate_all("links => links.map(l => l.href)")
    base_css = [u for u in css if "/static/admin/css/base." in u]
    assert base_css and re.search(r"/base\.[0-9a-f]{12}\.css$", base_css[0]), css
    response = requests.get(base_css[0], headers={"Accept-Encoding": "gzip"}, timeout=10)
    assert response.status_code == 200
    assert response.headers["Content-Encoding"] == "gzip"
    assert "immutable" in response.headers["Cache-Control"]
    b.screenshot(page, "login")

    b.log_in(page, web_server.url, "admin", "password")
    header_bg = page.locator("#header").evaluate("e => getComputedStyle(e).backgroundColor")
    assert header_bg not in ("rgba(0, 0, 0, 0)", "transparent"), header_bg
    b.screenshot(page, "admin_index")

    # "View site" leads to the landing page, whose links reach every part.
    with page.expect_navigation():
        page.get_by_role("link", name="View site").click()
    assert page.url == f"{web_server.url}/"
    expect(page.locator("h1")).to_have_text("Cronyard")
    for name in ("Console", "API docs", "Metrics", "Health"):
        expect(page.get_by_role("link", name=name, exact=True)).to_be_visible()
    b.screenshot(page, "landing")


def test_api_docs_render_offline(page):
    """Swagger UI and ReDoc come from our own /static/: every request the pages make goes
    to 127.0.0.1 (the page fixture checks it too), and both render the schema."""
    problems = b.PageProblems()
    problems.watch(page)
    local = []
    page.on("request", lambda r: local.append(r.url))
    page.goto("/api/docs/")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("Cronyard API")
    expect(page.locator(".swagger-ui .opblock").first).to_be_visible()
    b.screenshot(page, "api_docs")
    page.goto("/api/redoc/")
    expect(page.locator("h1", has_text="Cronyard API")).to_be_visible()
    expect(page.locator("text=API docs by Redocly")).to_be_visible()  # the footer with the logo
    page.wait_for_load_state("networkidle")
    assert any("/static/drf_spectacular_sidecar/swagger-ui-dist/" in u for u in local), local
    assert any("/static/drf_spectacular_sidecar/redoc/" in u for u in local), local
    assert problems.foreign_requests == [], problems.foreign_requests


def test_login_search_filter_and_pause_resume_actions(page, web_server, admin_user, acme):
    services.create_job(tenant=acme, fields=dict(name="nightly export", cron_expr="30 2 * * *", target=HOOK))
    poller = services.create_job(tenant=acme, fields=dict(name="poller", interval_seconds=60, target=HOOK))
    services.create_job(
        tenant=acme,
        fields=dict(name="one shot", run_at=timezone.now() + timedelta(days=30), target=HOOK, paused=True),
    )

    # A wrong password stays on the form with Django's error; the right one lands on `next`.
    page.goto("/admin/login/?next=/admin/jobs/job/")
    page.fill("#id_username", "admin")
    page.fill("#id_password", "wrong")
    page.click("input[type=submit]")
    expect(page.locator(".errornote")).to_contain_text("correct username and password")
    b.log_in(page, web_server.url, "admin", "password", next_path="/admin/jobs/job/")
    assert page.url.endswith("/admin/jobs/job/")
    assert sorted(b.listed_names(page)) == ["nightly export", "one shot", "poller"]
    expect(b.row(page, "nightly export")).to_contain_text("30 2 * * *")

    page.fill("#searchbar", "nightly")
    page.press("#searchbar", "Enter")
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    assert b.listed_names(page) == ["nightly export"]

    page.goto("/admin/jobs/job/")
    page.locator("#changelist-filter details[data-filter-title='trigger type']").get_by_role(
        "link", name="Interval"
    ).click()
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    assert b.listed_names(page) == ["poller"]
    assert "trigger=interval" in page.url
    page.locator("#changelist-filter details[data-filter-title='paused']").get_by_role(
        "link", name="Yes"
    ).click()
    expect(page.locator("#changelist-filter")).to_be_visible()
    assert b.listed_names(page) == []  # the filters combine: no paused interval job

    page.goto("/admin/jobs/job/?paused__exact=1")
    assert b.listed_names(page) == ["one shot"]

    page.goto("/admin/jobs/job/")
    assert b.run_action(page, "pause_jobs", "poller") == [("success", "Paused 1 job(s).")]
    poller.refresh_from_db()
    assert poller.paused is True
    expect(b.row(page, "poller").locator("td.field-state")).to_have_text("paused")
    expect(b.row(page, "nightly export").locator("td.field-state")).to_have_text("active")
    expect(page.locator("#result_list img[src*='icon-no']")).to_have_count(0)
    b.screenshot(page, "jobs_list")

    assert b.run_action(page, "resume_jobs", "poller") == [("success", "Resumed 1 job(s).")]
    poller.refresh_from_db()
    assert poller.paused is False
    assert poller.next_run_at > timezone.now() - timedelta(seconds=5)


def next_spring_forward_sunday(after: datetime) -> date:
    """The next second Sunday of March (New York's spring forward) after `after`'s date."""
    for year in (after.year, after.year + 1):
        day = date(year, 3, 8)
        day += timedelta(days=(6 - day.weekday()) % 7)
        if day > after.date():
            return day
    raise AssertionError("unreachable")


def test_change_page_preview_live_preview_and_validation(signed_in, acme):
    page = signed_in
    job = services.create_job(
        tenant=acme, fields=dict(name="nightly export", cron_expr="30 2 * * *", target=HOOK)
    )
    page.goto(f"/admin/jobs/job/{job.pk}/edit/")

    # Server side: the saved schedule's next 5 fire times, computed here independently.
    saved = page.locator(".field-next_fire_times ol.cronyard-preview li")
    expect(saved).to_have_count(5)
    first = next_daily(timezone.now(), 2, 30)
    expected = [z(first + timedelta(days=i)) for i in range(5)]
    assert [t.split()[0] for t in saved.all_inner_texts()] == expected

    # Client side: typing a new expression refreshes the live box from the JSON endpoint.
    # The script moves the box into the Schedule fieldset, next to the fields typed into.
    live = page.locator("#cronyard-live-preview")
    expect(page.locator("fieldset:has(#id_cron_expr) #cronyard-live-preview")).to_have_count(1)
    expect(live).to_contain_text("Edit cron")
    page.fill("#id_cron_expr", "15 4 * * 1")
    expect(live.locator("li")).to_have_count(5)
    monday = next_daily(timezone.now(), 4, 15, weekday=0)
    expect(live.locator("li").first).to_contain_text(z(monday))
    expect(live.locator("li").nth(1)).to_contain_text(z(monday + timedelta(days=7)))
    expect(live.locator("p")).to_contain_text(re.compile("Monday", re.IGNORECASE))
    b.screenshot(page, "job_change")
    # The zone is part of the preview request: New York's 04:15 is 08:15 or 09:15 UTC.
    page.fill("#id_time_zone", "America/New_York")
    expect(live.locator("li").first).to_contain_text(re.compile(r"T(08|09):15:00Z"))
    page.fill("#id_time_zone", "UTC")
    expect(live.locator("li").first).to_contain_text(z(monday))
    # An interval instead: its slots are whole seconds, as create_job anchors them. The
    # form shows the interval's field once the kind is chosen.
    page.fill("#id_cron_expr", "")
    page.locator("#id_trigger_kind input[value='interval']").check()
    page.fill("#id_interval_seconds", "90")
    expect(live.locator("p")).to_contain_text("90 seconds")
    interval_slots = live.locator("li").all_inner_texts()
    assert all(re.match(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ ", t) for t in interval_slots), interval_slots
    page.fill("#id_interval_seconds", "")
    page.locator("#id_trigger_kind input[value='cron']").check()
    # The DST policy is two menus, and the live preview follows them. New York springs
    # forward on the second Sunday of March: 02:30 does not exist that day. Cron's rule
    # for a fixed time runs it just after the gap (03:00 EDT = 07:00Z); "not at all" skips it.
    gap = next_spring_forward_sunday(timezone.now())
    page.fill("#id_cron_expr", "30 2 * 3 0")
    page.fill("#id_time_zone", "America/New_York")
    expect(live.locator("li")).to_have_count(5)
    expect(live).to_contain_text(f"{gap}T07:00:00Z")
    page.select_option("select[name=dst_policy_missing]", "skip")
    expect(live).to_contain_text(f"02:30 does not exist on {gap}; policy 'skip'")
    expect(live).not_to_contain_text(f"{gap}T07:00:00Z")
    expect(live.locator("li")).to_have_count(5)
    page.select_option("select[name=dst_policy_missing]", "")
    expect(live).to_contain_text(f"{gap}T07:00:00Z")
    page.fill("#id_time_zone", "UTC")

    # A bad expression: the live box says why, and saving is refused with nothing written.
    page.fill("#id_cron_expr", "61 * * * *")
    expect(live.locator("li")).to_have_count(0)
    expect(live).not_to_be_empty()
    live_error = live.inner_text()
    with page.expect_navigation():
        page.click("input[name=_save]")
    expect(page.locator(".errornote")).to_be_visible()
    field_error = page.locator(".field-cron_expr .errorlist")
    expect(field_error).not_to_be_empty()
    assert page.input_value("#id_cron_expr") == "61 * * * *"
    job.refresh_from_db()
    assert (job.cron_expr, job.next_run_at) == ("30 2 * * *", first)
    print(f"live preview error: {live_error!r}; form error: {field_error.inner_text()!r}")

    # A good expression saves through the service: the new slot is the Monday one.
    page.fill("#id_cron_expr", "15 4 * * 1")
    with page.expect_navigation():
        page.click("input[name=_save]")
    assert b.messages(page)[0][0] == "success"
    job.refresh_from_db()
    assert (job.cron_expr, job.next_run_at) == ("15 4 * * 1", monday)


def test_dead_letter_queue_bulk_replay(signed_in, acme):
    page = signed_in
    job = services.create_job(
        tenant=acme, fields=dict(name="flaky export", interval_seconds=3600, target=HOOK)
    )
    dead, waiting = enqueue(job, *minutes_ago(5, 4))
    JobRunRow.objects.filter(pk=dead.pk).update(
        status="dead",
        attempt=3,
        result_code=500,
        last_error="HTTP 500 from target",
        finished_at=timezone.now(),
    )

    page.goto("/admin/runs/deadrun/")
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    expect(b.row(page, "flaky export")).to_contain_text("HTTP 500 from target")
    expect(b.row(page, "flaky export")).to_contain_text(in_zone(dead.scheduled_at))

    # The action asks first, naming the runs; nothing changes until Yes.
    assert b.run_action(page, "replay_selected", "flaky export") == []
    expect(page.locator("#cronyard-confirm-runs li")).to_have_count(1)
    expect(page.locator("#cronyard-confirm-runs")).to_contain_text(dead.run_key)
    dead.refresh_from_db()
    assert dead.status == "dead"
    with page.expect_navigation():
        page.click("input[value='Yes, replay']")
    messages = b.messages(page)
    assert messages == [("success", "Replayed 1 run(s); ignored 0 that were not dead or cancelled.")]
    dead.refresh_from_db()
    waiting.refresh_from_db()
    assert (dead.status, waiting.status) == ("queued", "queued")
    expect(page.locator("#result_list")).to_have_count(0)  # the queue is empty now
    expect(page.locator("#changelist .paginator")).to_contain_text("0 dead runs in the queue")


def test_dead_letter_queue_replay_from_the_row(signed_in, acme):
    page = signed_in
    job = services.create_job(
        tenant=acme, fields=dict(name="nightly sync", interval_seconds=3600, target=HOOK)
    )
    first, second = enqueue(job, *minutes_ago(9, 8))
    JobRunRow.objects.filter(pk__in=[first.pk, second.pk]).update(
        status="dead", attempt=5, result_code=503, last_error="HTTP 503", finished_at=timezone.now()
    )
    page.goto("/admin/runs/deadrun/")
    expect(page.locator("#result_list tbody tr")).to_have_count(2)
    page.set_viewport_size({"width": 1280, "height": 800})
    b.screenshot(page, "dead_letter", full_page=False)
    row = page.locator("#result_list tbody tr", has_text=in_zone(first.scheduled_at))
    with page.expect_navigation():
        row.get_by_role("link", name="Replay…").click()
    expect(page.locator("#cronyard-confirm-runs")).to_contain_text(first.run_key)
    with page.expect_navigation():
        page.click("input[value='Yes, replay']")
    assert page.url.endswith("/admin/runs/deadrun/")
    assert b.messages(page)[0] == ("success", f"Replayed: re-queued under the same run key. {first.run_key}")
    # The message links to the run it replayed.
    link = page.locator(".messagelist a", has_text=first.run_key)
    assert link.get_attribute("href") == f"/admin/runs/jobrun/{first.pk}/change/"
    first.refresh_from_db()
    second.refresh_from_db()
    assert (first.status, second.status) == ("queued", "dead")  # only that row
    expect(page.locator("#result_list tbody tr")).to_have_count(1)


def test_dashboard_numbers_for_a_known_state(signed_in, acme, request):
    request_cleanup = request.addfinalizer
    page = signed_in
    globex, _ = tenant_services.create_tenant(slug="globex", name="Globex", max_concurrency=5)
    late = services.create_job(tenant=acme, fields=dict(name="late", interval_seconds=3600, target=HOOK))
    paused = services.create_job(
        tenant=acme, fields=dict(name="paused late", interval_seconds=3600, target=HOOK, paused=True)
    )
    urgent = services.create_job(
        tenant=globex, fields=dict(name="urgent", interval_seconds=3600, target=HOOK, priority=5)
    )
    now = timezone.now()
    Job.objects.filter(pk=late.pk).update(next_run_at=now - timedelta(seconds=120))
    # Paused jobs are not late however old their slot: the lateness must stay ~120 s.
    Job.objects.filter(pk=paused.pk).update(next_run_at=now - timedelta(seconds=900))

    _queued, _queued_too, running = enqueue(late, *minutes_ago(3, 2, 1))
    JobRunRow.objects.filter(pk=running.pk).update(
        status="running", attempt=1, owner="exec-1", started_at=now, lease_until=now + timedelta(seconds=30)
    )
    _queued_urgent, dead, done = enqueue(urgent, *minutes_ago(6, 5, 4))
    JobRunRow.objects.filter(pk=dead.pk).update(status="dead", attempt=5, finished_at=now)
    JobRunRow.objects.filter(pk=done.pk).update(status="succeeded", attempt=1, finished_at=now)
    SchedulerNode.objects.create(
        node_id="node-a",
        hostname="box1",
        pid=4242,
        started_at=now,
        heartbeat_at=now,
        partitions=list(range(200)),
    )
    # Alive = fresh heartbeat AND its session connected (scheduler_project.liveness).
    node_session = nodes.sessions("node-a")
    node_session.__enter__()
    request_cleanup(lambda: node_session.__exit__(None, None, None))

    # Auto-refresh off while asserting: a reload mid-assertion would only add noise.
    page.goto("/admin/runs/jobrun/dashboard/?refresh=0")
    expect(page.locator("h1")).to_have_text("Operations dashboard")

    def metric(name: str) -> str:
        return page.locator(f"[data-metric='{name}']").inner_text().strip()

    oldest = page.locator("[data-metric='oldest_due_seconds']")
    assert 119 <= float(oldest.get_attribute("data-seconds")) < 180
    assert re.fullmatch(r"2 min( \d+ s)?", metric("oldest_due_seconds"))
    assert metric("due_jobs") == "1"
    assert metric("dead_last_day") == "1"
    assert metric("last_hour_total") == "6"
    assert {s: metric(f"last_hour_{s}") for s in ("queued", "running", "dead", "succeeded", "retrying")} == {
        "queued": "3",
        "running": "1",
        "dead": "1",
        "succeeded": "1",
        "retrying": "0",
    }
    assert (metric("live_nodes"), metric("unowned_partitions")) == ("1", "56")

    depth = page.locator("#queue-depth table")
    header = [t.strip() for t in depth.locator("thead th").all_text_contents()]
    rows = {
        r.get_attribute("data-priority"): dict(
            zip(header[1:], r.locator("td").all_inner_texts()[1:], strict=True)
        )
        for r in depth.locator("tbody tr").all()
    }
    assert rows == {
        "5": {"queued": "1", "running": "0", "retrying": "0", "total": "1"},
        "0": {"queued": "2", "running": "1", "retrying": "0", "total": "3"},
    }
    assert list(rows) == ["5", "0"]  # highest priority first
    totals = dict(zip(header[1:-1], depth.locator("tfoot th").all_inner_texts()[1:-1], strict=True))
    assert totals == {"queued": "3", "running": "1", "retrying": "0"}

    tenants = page.locator("#tenants tbody tr")
    expect(tenants.and_(page.locator("[data-tenant='acme']"))).to_contain_text("1 / 2")
    assert page.locator("#tenants [data-tenant='acme'] td").all_inner_texts() == ["acme", "1 / 2", "2"]
    assert page.locator("#tenants [data-tenant='globex'] td").all_inner_texts() == ["globex", "0 / 5", "1"]
    expect(page.locator("#nodes [data-node='node-a']")).to_contain_text("alive")
    # Recent changes are the audit log's, whoever made them (here the services, as the
    # API would): the newest first, with the job and what changed.
    audit = page.locator("#audit tbody tr")
    expect(audit).to_have_count(3)
    expect(audit.first).to_contain_text("globex: urgent")
    expect(audit.first).to_contain_text("Create")
    # A long executor id scrolls inside its card instead of pushing it out of its column.
    from runs.models import ExecutorNode

    ExecutorNode.objects.create(
        node_id="executor-" + "x" * 90, hostname="a-rather-long-host-name.example.internal", pid=1,
        started_at=now, heartbeat_at=now, concurrency=32,
    )  # fmt: skip
    page.reload()
    card = page.locator("#executors")
    expect(card.locator("table")).to_contain_text("executor-xxx")
    spills = card.evaluate(
        """e => {
            const table = e.querySelector("table").getBoundingClientRect();
            const box = e.getBoundingClientRect();
            return table.right > box.right && !["auto", "scroll"].includes(getComputedStyle(e).overflowX);
        }"""
    )
    assert not spills

    # The dead count links to the dead-letter queue, which lists exactly that run.
    page.locator("[data-metric='dead_last_day']").click()
    page.wait_for_url("**/admin/runs/deadrun/")
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    expect(b.row(page, "urgent")).to_contain_text(in_zone(dead.scheduled_at))

    # The charts: SVG drawn by the server, with marks carrying the same numbers.
    page.goto("/admin/runs/jobrun/dashboard/?refresh=0")
    runs_chart = page.locator("#chart-runs svg[data-chart='runs_per_minute']")
    expect(runs_chart).to_have_attribute("data-total", "6")
    bars = runs_chart.locator("rect[data-series]")
    assert sum(int(v) for v in bars.evaluate_all("rs => rs.map(r => r.dataset.value)")) == 6
    assert runs_chart.bounding_box()["height"] > 100  # drawn, not an empty box
    expect(page.locator("svg[data-chart='lateness'] circle[data-series='p50']")).to_have_count(1)
    depth_marks = page.locator("svg[data-chart='queue_depth'] rect[data-series]")
    pairs = depth_marks.evaluate_all("rs => rs.map(r => r.dataset.series + '=' + r.dataset.value)")
    assert sorted(pairs) == [
        "queued=1",
        "queued=2",
        "running=1",
    ]
    expect(page.locator("svg[data-chart='partitions'] rect[data-owner='node-a']")).to_have_count(200)
    expect(page.locator("svg[data-chart='oldest_due'] rect[data-value]")).to_have_count(1)
    page.goto("/admin/runs/jobrun/dashboard/")
    expect(page.locator("meta[http-equiv='refresh']")).to_have_attribute("content", "15")
    b.screenshot(page, "dashboard")
    b.screenshot(page, "tour_dashboard", full_page=False)


def test_job_page_pause_trigger_resume_with_confirmation(signed_in, acme):
    """The buttons on the job's page: each confirmation says what will happen, the POST
    does it through jobs.services, and the runs it made appear inline."""
    page = signed_in
    job = services.create_job(tenant=acme, fields=dict(name="report", interval_seconds=600, target=HOOK))
    change = f"/admin/jobs/job/{job.pk}/change/"
    page.goto(change)
    expect(page.locator(".field-recent_runs")).to_contain_text("No runs yet.")

    page.locator("#cronyard-pause").click()
    expect(page.locator("#cronyard-plan")).to_contain_text("Pause: the next slot")
    b.screenshot(page, "job_pause_confirm")
    with page.expect_navigation():
        page.get_by_role("button", name="Yes, pause").click()
    expect(page.locator(".messagelist li.success")).to_have_text("Paused: no slot fires until it is resumed.")
    job.refresh_from_db()
    assert job.paused

    page.locator("#cronyard-trigger").click()
    expect(page.locator("#cronyard-plan")).to_contain_text("Trigger now: one manual run is queued")
    with page.expect_navigation():
        page.get_by_role("button", name="Yes, trigger").click()
    expect(page.locator(".messagelist li.success")).to_contain_text("Queued a manual run at ")
    manual = JobRun.objects.get(job_id=job.pk)
    inline = page.locator("table.cronyard-runs tbody tr")
    expect(inline).to_have_count(1)
    expect(inline.first).to_contain_text("manual")
    expect(inline.first.locator(".cronyard-status")).to_have_text("queued")

    # Three slots fell while paused (every 600 s; the next is ~5 min away, far from any edge).
    # (created before them: the ledger speaks only for the job's lifetime).
    now = timezone.now().replace(microsecond=0)
    since = now - timedelta(hours=1)
    Job.objects.filter(pk=job.pk).update(
        next_run_at=now - timedelta(seconds=1500), created_at=since, schedule_since=since
    )
    page.goto(change)
    page.locator("#cronyard-resume").click()
    choices = page.locator("label.cy-choice")
    expect(choices).to_have_count(3)
    expect(choices.and_(page.locator("[data-catch-up='none']"))).to_contain_text(
        "3 slots fell while paused and will not run"
    )
    expect(choices.and_(page.locator("[data-catch-up='all']"))).to_contain_text("3 runs queued now")
    page.locator("input[name=catch_up][value=all]").check()
    b.screenshot(page, "job_resume_confirm")
    b.screenshot(page, "tour_resume_confirm", full_page=False)
    with page.expect_navigation():
        page.get_by_role("button", name="Yes, resume").click()
    expect(page.locator(".messagelist li.success")).to_contain_text("Resumed (catch-up: all)")
    job.refresh_from_db()
    assert not job.paused and job.next_run_at > now
    expect(inline).to_have_count(4)  # three catch-up runs above the manual one
    expect(page.locator("table.cronyard-runs tbody tr", has_text="catch_up")).to_have_count(3)
    expect(page.locator(f"table.cronyard-runs tr[data-run='{manual.pk}']")).to_contain_text("manual")
    # The ledger: the three paused slots fired by the catch-up, and the manual run.
    expect(page.locator(".field-recent_occurrences tr[data-outcome='fired']")).to_have_count(4)
    b.screenshot(page, "job_page")
    b.screenshot(page, "tour_job_page", full_page=False)  # the README tour: what an operator sees first

    # All runs of the job, pre-filtered.
    page.locator("#cronyard-all-runs").click()
    page.wait_for_url(f"**/admin/runs/jobrun/?job={job.pk}")
    expect(page.locator("#result_list tbody tr")).to_have_count(4)

    # Every button is audited under the operator who clicked it, not as `system`.
    clicks = AuditEntry.objects.filter(job_id=job.pk).exclude(action="create").order_by("id")
    assert [(e.action, e.actor) for e in clicks] == [
        ("pause", "admin:admin"),
        ("trigger", "admin:admin"),
        ("resume", "admin:admin"),
    ]


def test_create_a_job_with_the_structured_target_form(signed_in, acme):
    page = signed_in
    page.goto("/admin/jobs/job/add/")
    expect(page.locator("label[for=id_cron_expr]")).to_have_text("cron:")
    expect(page.locator("label[for=id_time_zone]")).to_have_text("timezone:")
    page.select_option("#id_tenant", label=str(acme))
    page.fill("#id_name", "structured")
    page.fill("#id_cron_expr", "0 6 * * *")
    expect(page.locator("#cronyard-live-preview li")).to_have_count(5)
    page.select_option("#cy-target-type", "http")
    page.fill("#cy-target-url", "https://example.com/structured")
    page.select_option("#cy-target-method", "PUT")
    page.fill("#cy-target-headers", "X-Team: ops\nAuthorization: Bearer abc")
    page.fill("#cy-target-body", '{"hello": 1}')
    expect(page.locator("#cy-target-name")).to_be_hidden()  # task fields only for task targets
    b.screenshot(page, "job_add_structured_target")
    with page.expect_navigation():
        page.click("input[name=_save]")
    expect(page.locator(".messagelist li.success")).to_have_count(1)  # waits for the landing page
    assert page.locator(".errorlist, .errornote").all_inner_texts() == []
    job = Job.objects.get(name="structured")
    assert job.target["url"] == "https://example.com/structured"
    assert job.target["method"] == "PUT"
    assert job.target["headers"] == {"X-Team": "ops", "Authorization": "Bearer abc"}
    assert job.target["body"] == '{"hello": 1}'

    # A task target: the JSON follows the fields, and editing the JSON refills them.
    page.goto(f"/admin/jobs/job/{job.pk}/edit/")
    expect(page.locator("#cy-target-url")).to_have_value("https://example.com/structured")
    page.select_option("#cy-target-type", "task")
    page.select_option("#cy-target-name", "echo")
    page.fill("#cy-target-kwargs", '{"n": 3}')  # echo takes **kwargs: free-form JSON
    with page.expect_navigation():
        page.click("input[name=_save]")
    expect(page.locator(".messagelist li.success")).to_have_count(1)
    job.refresh_from_db()
    assert job.target["type"] == "task" and job.target["name"] == "echo" and job.target["kwargs"] == {"n": 3}
    assert "url" not in job.target and "headers" not in job.target


def add_task_job(page, acme, name: str) -> None:
    page.goto("/admin/jobs/job/add/")
    page.select_option("#id_tenant", label=str(acme))
    page.fill("#id_name", name)
    page.fill("#id_cron_expr", "0 6 * * *")
    page.select_option("#cy-target-type", "task")


def save(page) -> None:
    with page.expect_navigation():
        page.click("input[name=_save]")


def test_task_kwargs_form_writes_the_target_and_shows_field_errors(signed_in, acme):
    page = signed_in
    add_task_job(page, acme, "sleeper")
    page.select_option("#cy-target-name", "sleep")
    # One input per kwarg of the schema, filled with its default.
    expect(page.locator("#cy-kwarg-seconds")).to_have_attribute("type", "number")
    expect(page.locator("#cy-kwarg-seconds")).to_have_value("1")
    expect(page.locator("#cy-task-about")).to_contain_text("Waits `seconds`")
    expect(page.locator("#cy-target-kwargs")).to_be_hidden()  # sleep takes no other kwargs
    page.fill("#cy-kwarg-seconds", "7.5")
    page.locator("fieldset", has=page.locator("#cronyard-target")).evaluate("e => e.scrollIntoView()")
    b.screenshot(page, "job_add_task_kwargs", full_page=False)
    save(page)
    expect(page.locator(".messagelist li.success")).to_have_count(1)
    job = Job.objects.get(name="sleeper")
    assert job.target["name"] == "sleep" and job.target["kwargs"] == {"seconds": 7.5}

    # The stored kwargs refill the input; a wrong type typed into the raw JSON is the
    # server's 400-style form error, shown beside the kwarg's own input.
    page.goto(f"/admin/jobs/job/{job.pk}/edit/")
    expect(page.locator("#cy-kwarg-seconds")).to_have_value("7.5")
    page.locator("details summary", has_text="Raw JSON").click()
    page.fill("#id_target", '{"type": "task", "name": "sleep", "kwargs": {"seconds": "x", "keep": 1}}')
    save(page)
    expect(page.locator(".errornote")).to_be_visible()
    expect(page.locator("#cy-kwarg-seconds-error")).to_contain_text("target.kwargs.seconds: must be a number")
    # The unknown key is kept (and named where free-form kwargs are edited).
    expect(page.locator("#cy-target-kwargs")).to_have_value('{\n "keep": 1\n}')
    expect(page.locator("#cy-target-kwargs-error")).to_contain_text("target.kwargs.keep")
    page.locator("#cy-kwarg-seconds-error").evaluate("e => e.scrollIntoView({block: 'center'})")
    b.screenshot(page, "job_task_kwargs_error", full_page=False)
    job.refresh_from_db()
    assert job.target["kwargs"] == {"seconds": 7.5}  # nothing half-written


def test_task_kwargs_form_has_an_input_per_kind(signed_in, acme):
    page = signed_in
    add_task_job(page, acme, "kinds")
    page.select_option("#cy-target-name", "tests.form_kinds")
    expect(page.locator("#cy-kwarg-count")).to_have_attribute("type", "number")
    expect(page.locator("#cy-kwarg-count")).to_have_attribute("step", "1")
    expect(page.locator("label[for=cy-kwarg-count]")).to_have_class(re.compile(r"\brequired\b"))
    expect(page.locator("label[for=cy-kwarg-label]")).not_to_have_class(re.compile(r"\brequired\b"))
    expect(page.locator("#cy-kwarg-verbose")).to_have_attribute("type", "checkbox")
    expect(page.locator("select#cy-kwarg-mode option")).to_have_text(["(not set)", "fast", "slow"])
    expect(page.locator("select#cy-kwarg-mode")).to_have_value('"fast"')
    expect(page.locator("textarea#cy-kwarg-tags")).to_have_value("")
    expect(page.locator("#cy-kwarg-label")).to_have_attribute("type", "text")

    # A fraction where a whole number goes: the server names the field, beside it.
    page.fill("#cy-kwarg-count", "2.5")
    save(page)
    whole = "target.kwargs.count: must be a whole number"
    expect(page.locator("#cy-kwarg-count-error")).to_contain_text(whole)
    expect(page.locator("#cy-kwarg-count")).to_have_value("2.5")
    page.fill("#cy-kwarg-count", "3")
    expect(page.locator("#cy-kwarg-count-error")).to_be_hidden()  # edited: the old error goes
    page.check("#cy-kwarg-verbose")
    page.select_option("#cy-kwarg-mode", label="slow")
    page.fill("#cy-kwarg-tags", '["a", "b"]')
    page.fill("#cy-kwarg-label", "nightly")
    page.locator("fieldset", has=page.locator("#cronyard-target")).evaluate("e => e.scrollIntoView()")
    b.screenshot(page, "job_add_task_kwargs_kinds", full_page=False)
    save(page)
    expect(page.locator(".messagelist li.success")).to_have_count(1)
    job = Job.objects.get(name="kinds")
    assert job.target["kwargs"] == {
        "count": 3,
        "verbose": True,
        "mode": "slow",
        "tags": ["a", "b"],
        "label": "nightly",
    }


def test_runs_list_fits_1280_pixels_and_shows_one_moment_format(signed_in, acme):
    page = signed_in
    job = services.create_job(
        tenant=acme,
        fields=dict(
            name="a job with a rather long name for the list",
            cron_expr="0 9 * * *",
            time_zone="America/New_York",
            target=HOOK,
        ),
    )
    (run,) = enqueue(job, *minutes_ago(3))
    started = timezone.now() - timedelta(minutes=2)
    JobRunRow.objects.filter(pk=run.pk).update(
        status="succeeded", attempt=1, started_at=started, finished_at=started + timedelta(seconds=1)
    )
    page.set_viewport_size({"width": 1280, "height": 800})
    page.goto("/admin/runs/jobrun/")
    row = b.row(page, "a job with a rather long name")
    # The console's one rule: the job's wall time to the second with its zone, the UTC
    # instant and the relative time on hover, a relative time below, the run's length.
    expect(row).to_contain_text(in_zone(run.scheduled_at, "America/New_York"))
    expect(row).to_contain_text(in_zone(started, "America/New_York"))
    assert row.locator(f"time[title^='{format_utc(started)} · '][title$='ago']").count() == 1
    assert row.locator("time.cy-moment").count() == 2  # scheduled and started
    expect(row.locator(".cronyard-relative").first).to_contain_text("ago")
    expect(row.locator(".cronyard-duration")).to_have_text("· ran 1.0 s")
    # The run's page: the same rule for each of its moments, and its title.
    with page.expect_navigation():
        row.locator("a").first.click()
    expect(page.locator("h1")).to_have_text(
        f"Run of {job.name} at {in_zone(run.scheduled_at, 'America/New_York')}"
    )
    expect(page.locator(".field-started_at_shown .readonly")).to_have_text(
        in_zone(started, "America/New_York")
    )
    expect(page.locator(".field-run_length .readonly")).to_have_text("1.0 s")
    assert not re.search(r"[ap]\.m\.", page.locator("#content").inner_text())
    page.go_back()
    # Nothing is clipped: the table fits its scrolling container, left of the filters.
    widths = page.evaluate(
        "() => { const r = document.querySelector('#changelist .results');"
        " return [r.scrollWidth, r.clientWidth]; }"
    )
    b.screenshot(page, "runs_list_1280")
    assert widths[0] <= widths[1] + 1, widths


def test_view_only_staff_see_the_target_without_its_secrets(page, web_server, acme):
    """A staff user who may only view jobs gets every field read-only; the target must
    still show "***" for every secret, as the editor's form does."""
    from django.contrib.auth.models import Permission, User

    viewer = User.objects.create_user("viewer", password="viewer-pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_job"))
    secrets = {
        "Authorization": "Bearer vo-authorization-1",
        "X-Sig": "vo-marked-2",
        "pw": "vo-url-password-3",
        "token": "vo-query-token-4",
    }
    target = {
        "type": "http",
        "url": f"https://svc:{secrets['pw']}@hooks.example.com/run?token={secrets['token']}&team=blue",
        "headers": {"Authorization": secrets["Authorization"], "X-Sig": secrets["X-Sig"], "X-Team": "blue"},
        "secret_headers": ["X-Sig"],
    }
    job = services.create_job(tenant=acme, fields=dict(name="guarded", interval_seconds=600, target=target))
    b.log_in(page, web_server.url, "viewer", "viewer-pw")
    page.goto(f"/admin/jobs/job/{job.pk}/edit/")
    expect(page.locator("#content h1")).to_be_visible()
    expect(page.locator("input[type=submit]")).to_have_count(0)  # view-only: no form to save
    html = page.content()
    for name, value in secrets.items():
        assert value not in html, f"{name} shown to a view-only user"
    expect(page.locator(".field-target_redacted")).to_contain_text('"X-Team": "blue"')
    assert html.count("***") >= 4
    expect(
        page.locator("#cronyard-edit, #cronyard-pause, #cronyard-trigger, #cronyard-backfill")
    ).to_have_count(0)
    # Django's read-only form at edit/ masks them too.
    page.goto(f"/admin/jobs/job/{job.pk}/edit/")
    expect(page.locator(".field-target_redacted")).to_contain_text('"X-Team": "blue"')
    for name, value in secrets.items():
        assert value not in page.content(), f"{name} shown to a view-only user on the form"


def test_a_tenants_signing_secret_is_shown_once_in_the_console(page, web_server, admin_user):
    """Made with the tenant and rotated from the tenant list: each secret is in the message
    of the page that made it and on no page after, for the admin and a view-only user."""
    from django.contrib.auth.models import Permission, User

    b.log_in(page, web_server.url, "admin", "password", next_path="/admin/jobs/tenant/add/")
    page.fill("#id_slug", "initech")
    page.fill("#id_name", "Initech")
    with page.expect_navigation():
        page.click("input[name=_save]")
    (made,) = [text for _, text in b.messages(page) if text.startswith("Signing secret for initech")]
    first = made.rsplit(": ", 1)[1]
    tenant = Tenant.objects.get(slug="initech")
    assert first == tenant.signing_secret
    b.screenshot(page, "tenant_signing_secret_made", full_page=False)

    page.goto("/admin/jobs/tenant/")
    assert first.removeprefix("whsec_") not in page.content()
    shown = b.run_action(page, "rotate_signing_secret", "initech")
    (rotated,) = [text for _, text in shown if text.startswith("Signing secret for initech")]
    assert "the previous one signs too until" in rotated
    second = rotated.rsplit(": ", 1)[1]
    assert second == Tenant.objects.get(pk=tenant.pk).signing_secret != first
    b.screenshot(page, "tenant_signing_secret_rotated", full_page=False)

    page.goto(f"/admin/jobs/tenant/{tenant.pk}/change/")
    expect(page.locator(".field-signing_overlap")).to_contain_text("the previous secret signs too until")
    for secret in (first, second):
        assert secret.removeprefix("whsec_") not in page.content()
    b.screenshot(page, "tenant_signing_secret_page")

    viewer = User.objects.create_user("viewer", password="viewer-pw", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_tenant"))
    page.context.clear_cookies()
    b.log_in(page, web_server.url, "viewer", "viewer-pw", next_path="/admin/jobs/tenant/")
    expect(page.locator("#result_list tbody tr")).to_have_count(1)
    expect(page.locator("select[name=action] option[value=rotate_signing_secret]")).to_have_count(0)
    page.goto(f"/admin/jobs/tenant/{tenant.pk}/change/")
    expect(page.locator(".field-signing_overlap")).to_contain_text("shown once")
    for secret in (first, second):
        assert secret.removeprefix("whsec_") not in page.content()


def test_dashboard_forecast_marks_spikes_and_says_how_to_spread_them(signed_in, acme):
    """The next 24 h of due runs per minute, from the schedules: every tenant, or one;
    the spikes marked and explained; and the job page says when its slot is in one."""
    page = signed_in
    globex, _ = tenant_services.create_tenant(slug="globex", name="Globex", max_concurrency=5)
    hourly = [
        services.create_job(tenant=acme, fields=dict(name=f"hourly {i}", cron_expr="0 * * * *", target=HOOK))
        for i in range(12)
    ]
    for i in range(2):
        services.create_job(tenant=acme, fields=dict(name=f"five {i}", cron_expr="*/5 * * * *", target=HOOK))
    quiet = services.create_job(tenant=acme, fields=dict(name="quiet", cron_expr="17 3 * * *", target=HOOK))
    for i in range(6):
        services.create_job(
            tenant=globex,
            fields=dict(name=f"berlin {i}", cron_expr="0 * * * *", time_zone="Europe/Berlin", target=HOOK),
        )
    services.create_job(
        tenant=globex, fields=dict(name="stopped", cron_expr="* * * * *", target=HOOK, paused=True)
    )

    page.goto("/admin/runs/jobrun/dashboard/?refresh=0")
    chart = page.locator("#forecast svg[data-chart='forecast']")
    expect(chart).to_have_attribute("data-steps", "1440")
    total = int(chart.get_attribute("data-total"))
    # 18 hourly jobs, 2 every 5 minutes, 1 daily: a day of them (the current minute's
    # slot may have passed), and nothing of the paused minutely job.
    assert 18 * 23 + 2 * 287 + 1 <= total <= 18 * 24 + 2 * 288 + 1, total
    assert page.locator("[data-metric='forecast_total']").inner_text() == str(total)
    # Every top of the hour holds 20 runs, the other fifth minutes 2: one spike, the wall
    # (its count once, at its first minute, with how often it recurs), each of its bars in red.
    spikes = chart.locator("rect[data-spike]")
    expect(spikes).to_have_count(1)
    assert spikes.evaluate_all("rs => rs.map(r => r.dataset.value)") == ["20"]
    red = chart.locator("path[stroke='#cf222e']").get_attribute("d")
    assert red.count("M") in (23, 24)  # every top of the hour in the next 24 h
    first = page.locator("#forecast tr[data-spike='1']")
    expect(first.locator("[data-metric='spike_count']")).to_have_text("20")
    expect(first.locator("[data-metric='spike_repeats']")).to_have_text(re.compile(r"and 2[23] more minutes"))
    # Counted by expression, whatever its zones.
    hourly_cause = first.locator("li[data-cause='0 * * * *']")
    expect(hourly_cause).to_contain_text("18 jobs on 0 * * * * (UTC 12, Europe/Berlin 6)")
    expect(hourly_cause).to_contain_text("spread: use H * * * *")
    expect(first.locator("li[data-cause='*/5 * * * *']")).to_contain_text("spread: use H/5 * * * *")
    loads = page.locator("#forecast table.cy-tenant-load tbody tr")
    assert [r.get_attribute("data-tenant") for r in loads.all()] == ["acme", "globex"]
    b.screenshot(page, "dashboard_forecast")
    page.locator("#forecast").evaluate("e => e.scrollIntoView({block: 'start'})")
    b.screenshot(page, "tour_forecast", full_page=False)

    # One tenant's view: globex's six Berlin jobs, nothing of acme's.
    page.select_option("#forecast-tenant", "globex")
    with page.expect_navigation():
        page.locator("#forecast input[type=submit]").click()
    expect(page.locator("#forecast h2")).to_contain_text("tenant globex")
    globex_total = int(page.locator("#forecast svg[data-chart='forecast']").get_attribute("data-total"))
    assert 6 * 23 <= globex_total <= 6 * 24
    expect(page.locator("#forecast tr[data-spike='1'] [data-metric='spike_count']")).to_have_text("6")

    # The job page: an hourly job's next slot is in a spike; the daily one's is not.
    page.goto(f"/admin/jobs/job/{hourly[0].pk}/change/")
    load = page.locator(".field-load_at_next_slot .cronyard-load")
    expect(load).to_contain_text("Inside a load spike")
    expect(load).to_contain_text("H * * * *")
    assert load.get_attribute("data-count") == "20"
    b.screenshot(page, "job_load_spike")
    page.goto(f"/admin/jobs/job/{quiet.pk}/change/")
    expect(page.locator(".field-load_at_next_slot .cronyard-load")).to_contain_text("is not in a load spike")


def test_preview_changes_shows_both_lists_and_saves_nothing(signed_in, acme):
    page = signed_in
    job = services.create_job(
        tenant=acme,
        fields=dict(name="hourly report", cron_expr="0 * * * *", time_zone="Europe/Berlin", target=HOOK),
    )
    page.goto(f"/admin/jobs/job/{job.pk}/edit/")
    panel = page.locator("#cronyard-edit-preview")
    # Before the Save buttons.
    assert (
        page.locator("#cronyard-edit-preview-module").bounding_box()["y"]
        < page.locator(".submit-row input[name=_save]").bounding_box()["y"]
    )
    page.fill("#id_cron_expr", "30 * * * *")
    page.locator("#cronyard-edit-preview-button").click()
    expect(page.locator("#cronyard-edit-preview-summary")).to_contain_text(
        "168 fire times added, 168 removed"
    )
    before, after = page.locator("#cronyard-edit-before"), page.locator("#cronyard-edit-after")
    expect(before.locator("li.removed")).to_have_count(50)
    expect(after.locator("li.added")).to_have_count(50)
    # The wall time in the job's zone, then the UTC instant (shown because they differ).
    expect(before.locator("li").first).to_contain_text(re.compile(r":00:00 CET \(\S+:00:00Z\)"))
    expect(after.locator("li").first).to_contain_text(re.compile(r":30:00 CET \(\S+:30:00Z\)"))
    left, right = before.bounding_box(), after.bounding_box()
    assert left["x"] + left["width"] <= right["x"] and abs(left["y"] - right["y"]) < 2  # side by side
    expect(panel).to_contain_text("an edit never fires a past slot")
    expect(panel).to_contain_text("Audit entry: cron changed.")
    first_after = re.search(r"\((\S+Z)\)", after.locator("li").first.inner_text()).group(1)
    b.screenshot(page, "job_edit_preview")
    page.locator("#cronyard-edit-preview-module").evaluate("e => e.scrollIntoView({block: 'start'})")
    b.screenshot(page, "tour_edit_preview", full_page=False)
    job.refresh_from_db()
    assert job.cron_expr == "0 * * * *"
    assert not AuditEntry.objects.filter(job_id=job.pk, action="update").exists()

    # What Save would refuse, the preview refuses with the same words.
    page.fill("#id_cron_expr", "61 * * * *")
    page.locator("#cronyard-edit-preview-button").click()
    expect(panel.locator(".cy-preview-error")).to_have_text("Save would refuse this change:")
    expect(panel.locator(".cy-preview-errors")).to_contain_text("cron_expr")

    # Saving does what the preview said.
    page.fill("#id_cron_expr", "30 * * * *")
    with page.expect_navigation():
        page.click("input[name=_save]")
    assert b.messages(page)[0][0] == "success"
    job.refresh_from_db()
    assert job.cron_expr == "30 * * * *" and z(job.next_run_at) == first_after


def strip_counts(page) -> dict[str, str]:
    """The status strip's numbers as shown, by count."""
    boxes = page.locator("#cronyard-strip a.cy-count")
    return {
        (boxes.nth(i).get_attribute("id") or "").removeprefix("strip-"): boxes.nth(i)
        .locator(".cy-n")
        .inner_text()
        for i in range(boxes.count())
    }


def test_status_strip_counts_and_links_for_everyone_and_for_one_tenant(signed_in, acme):
    """The strip on the admin home and the dashboard: each count is exactly the rows its
    link lists; narrowed to a tenant, another tenant's jobs and runs are not counted."""
    page = signed_in
    globex, _ = tenant_services.create_tenant(slug="globex", name="Globex")

    def job(tenant, name: str, **fields) -> Job:
        return services.create_job(
            tenant=tenant, fields=dict(name=name, interval_seconds=3600, target=HOOK, **fields)
        )

    failing = job(acme, "acme failing")
    wobbly = job(acme, "acme wobbly")  # one failure, alerts at 3: not failing
    stuck = job(acme, "acme stuck")
    held = job(acme, "acme held", paused=True)
    job(acme, "acme fine")
    theirs_failing = job(globex, "globex failing")
    theirs_stuck = job(globex, "globex stuck")
    job(globex, "globex held", paused=True)
    now = timezone.now()
    Job.objects.filter(pk__in=[failing.pk, theirs_failing.pk]).update(consecutive_failures=3)
    Job.objects.filter(pk=wobbly.pk).update(consecutive_failures=1)
    Job.objects.filter(pk__in=[stuck.pk, theirs_stuck.pk]).update(next_run_at=now - timedelta(hours=1))
    # Paused is not overdue, however old its slot.
    Job.objects.filter(pk=held.pk).update(next_run_at=now - timedelta(hours=2))
    (mine,) = enqueue(wobbly, *minutes_ago(5))
    (theirs,) = enqueue(theirs_failing, *minutes_ago(6))
    JobRunRow.objects.filter(pk__in=[mine.pk, theirs.pk]).update(status="dead", attempt=5, finished_at=now)

    for home in ("/admin/", "/admin/runs/jobrun/dashboard/?refresh=0"):
        page.goto(home)
        assert strip_counts(page) == {"failing": "2", "dead": "2", "overdue": "2", "paused": "2"}, home
    page.goto("/admin/")
    b.screenshot(page, "status_strip", full_page=False)

    page.select_option("#strip-tenant", "acme")
    with page.expect_navigation():
        page.click("#strip-tenant-form input[type=submit]")
    expect(page.locator("#cronyard-strip")).to_have_attribute("data-strip-tenant", "acme")
    assert strip_counts(page) == {"failing": "1", "dead": "1", "overdue": "1", "paused": "1"}
    listed = {}
    for key in ("failing", "dead", "overdue", "paused"):
        page.goto("/admin/?tenant=acme")
        with page.expect_navigation():
            page.click(f"#strip-{key}")
        listed[key] = sorted(b.listed_names(page))
    assert listed == {
        "failing": ["acme failing"],
        "dead": ["acme wobbly"],
        "overdue": ["acme stuck"],
        "paused": ["acme held"],
    }

    # Everyone's links list everyone's rows: the same rule, no tenant filter.
    page.goto("/admin/runs/jobrun/dashboard/?refresh=0")
    with page.expect_navigation():
        page.click("#strip-failing")
    assert sorted(b.listed_names(page)) == ["acme failing", "globex failing"]
    # The dashboard's strip keeps the dashboard's own parameters when narrowed.
    page.goto("/admin/runs/jobrun/dashboard/?refresh=0")
    page.select_option("#strip-tenant", "globex")
    with page.expect_navigation():
        page.click("#strip-tenant-form input[type=submit]")
    assert "refresh=0" in page.url and "tenant=globex" in page.url
    assert strip_counts(page) == {"failing": "1", "dead": "1", "overdue": "1", "paused": "1"}


def test_status_strip_counts_only_what_the_user_may_list(page, web_server, transactional_db, acme):
    """A staff user who may view jobs but not runs gets the jobs' counts, not the dead runs'."""
    from django.contrib.auth.models import Permission, User

    viewer = User.objects.create_user("viewer", password="password", is_staff=True)
    viewer.user_permissions.add(Permission.objects.get(codename="view_job"))
    failing = services.create_job(tenant=acme, fields=dict(name="failing", interval_seconds=60, target=HOOK))
    Job.objects.filter(pk=failing.pk).update(consecutive_failures=5)
    (run,) = enqueue(failing, *minutes_ago(2))
    JobRunRow.objects.filter(pk=run.pk).update(status="dead")
    b.log_in(page, web_server.url, "viewer", "password")
    assert strip_counts(page) == {"failing": "1", "overdue": "0", "paused": "0"}


def test_job_page_health_panel(signed_in, acme):
    """The job page's health figures, from seeded runs (expected values computed in
    tests/support/job_health.py), the same the job API's `health` object gives."""
    from tests.support import job_health

    page = signed_in
    job = services.create_job(tenant=acme, fields=dict(name="nightly sync", interval_seconds=60, target=HOOK))
    want = job_health.seed(job, consecutive_failures=4)
    Job.objects.filter(pk=job.pk).update(next_run_at=timezone.now() - timedelta(seconds=900))

    page.goto(f"/admin/jobs/job/{job.pk}/change/")
    panel = page.locator(".field-health_figures")

    def fact(key: str) -> str:
        return panel.locator(f"[data-health='{key}'] td").inner_text().strip()

    assert fact("consecutive_failures") == "4 failed attempts in a row (alerts at 3)"
    assert fact("last_success_at") == in_zone(want.last_success_at)
    assert fact("last_failure_at") == in_zone(want.last_failure_at)
    assert re.fullmatch(r"1[56] min( \d+ s)? late", fact("overdue_seconds")), fact("overdue_seconds")
    assert fact("misfire_count") == "2"

    def figures(key: str) -> list[str]:
        return panel.locator(f"[data-window-figure='{key}'] td").all_inner_texts()

    day, week = want.last_24h, want.last_7d
    assert figures("slots") == [str(day.slots), str(week.slots)]
    assert figures("on_time_rate") == [
        f"{day.rate * 100:.1f}% ({day.on_time} of {day.slots})",
        f"{week.rate * 100:.1f}% ({week.on_time} of {week.slots})",
    ]
    assert figures("lateness_p50_seconds") == [duration_text(day.p50), duration_text(week.p50)]
    assert figures("lateness_p99_seconds") == [duration_text(day.p99), duration_text(week.p99)]

    # The misfires link lists this job's misfires.
    with page.expect_navigation():
        panel.locator("[data-health='misfire_count'] a").click()
    expect(page.locator("#result_list tbody tr")).to_have_count(2)

    # alert_after_failures is on the form, and saving it changes what "failing" means.
    page.goto(f"/admin/jobs/job/{job.pk}/change/")
    panel.scroll_into_view_if_needed()
    b.screenshot(page, "job_health", full_page=False)
    with page.expect_navigation():
        page.locator("#cronyard-edit").click()
    page.fill("#id_alert_after_failures", "10")
    with page.expect_navigation():
        page.click("input[name=_save]")
    assert page.url.endswith(f"/admin/jobs/job/{job.pk}/change/")  # back on the job's page
    job.refresh_from_db()
    assert job.alert_after_failures == 10
    assert fact("consecutive_failures") == "4 failed attempts in a row (alerts at 10)"


def test_opening_a_job_reads_first_and_edits_from_a_button(signed_in, acme):
    """The job's page at 1280 px: schedule in words and next fire times on the job's
    clock, health, recent runs, the target with its secret header masked, and buttons."""
    from tests.support import job_health

    page = signed_in
    page.set_viewport_size({"width": 1280, "height": 900})
    target = {
        "type": "http",
        "url": "https://hooks.example.com/billing/sync",
        "method": "POST",
        "headers": {"Authorization": "Bearer rv-secret-token-1", "X-Team": "billing"},
        "secret_headers": ["Authorization"],
    }
    job = services.create_job(
        tenant=acme,
        fields=dict(
            name="billing sync", cron_expr="*/15 * * * *", time_zone="America/New_York", target=target
        ),
    )
    job_health.seed(job, consecutive_failures=1)

    # From the jobs list, the job's name leads to its page.
    page.goto("/admin/jobs/job/")
    with page.expect_navigation():
        b.row(page, "billing sync").get_by_role("link", name="billing sync").click()
    assert page.url.endswith(f"/admin/jobs/job/{job.pk}/change/")
    expect(page.locator("#content h1")).to_have_text("billing sync")
    expect(page.locator(".field-schedule_text")).to_contain_text("Every 15 minutes")
    fire_times = page.locator(".field-next_fire_times tbody tr")
    expect(fire_times).to_have_count(5)
    expect(fire_times.first).to_contain_text(re.compile(r"\d\d:(00|15|30|45) E[SD]T"))
    expect(page.locator(".field-health_figures [data-health='consecutive_failures']")).to_be_visible()
    expect(page.locator("table.cronyard-runs tbody tr").first).to_be_visible()
    expect(page.locator(".field-target_redacted")).to_contain_text('"Authorization": "***"')
    assert "rv-secret-token-1" not in page.content()
    for button in ("Edit", "Pause…", "Trigger now…", "Backfill…", "History", "Delete…"):
        expect(
            page.locator("#cronyard-job-tools").get_by_role("link", name=button, exact=True)
        ).to_be_visible()
    expect(page.locator("form#job_form")).to_have_count(0)  # nothing to submit here
    # The two columns fit the window: nothing spills sideways.
    width = page.evaluate("() => document.documentElement.scrollWidth")
    assert width <= 1280, width
    b.screenshot(page, "job_page_read")

    with page.expect_navigation():
        page.locator("#cronyard-edit").click()
    assert page.url.endswith(f"/admin/jobs/job/{job.pk}/edit/")
    expect(page.locator("#id_cron_expr")).to_have_value("*/15 * * * *")
    expect(page.locator(".breadcrumbs")).to_contain_text(re.compile(r"billing sync \W+ Edit"))
    b.screenshot(page, "job_edit", full_page=False)
    with page.expect_navigation():
        page.locator("#cronyard-view").click()
    assert page.url.endswith(f"/admin/jobs/job/{job.pk}/change/")


def test_backfill_from_the_job_page_previews_then_creates_exactly_those_runs(signed_in, acme):
    page = signed_in
    page.set_viewport_size({"width": 1280, "height": 900})
    job = services.create_job(
        tenant=acme, fields=dict(name="hourly import", cron_expr="0 * * * *", target=HOOK)
    )
    top = datetime.now(UTC).replace(minute=0, second=0, microsecond=0)
    slots = [top - timedelta(hours=h) for h in range(6, 0, -1)]  # six past hourly slots
    ran = enqueue(job, slots[1], slots[3])
    JobRunRow.objects.filter(pk__in=[r.pk for r in ran]).update(status="succeeded", attempt=1)
    missing = [z(s) for s in slots if s not in (slots[1], slots[3])]

    page.goto(f"/admin/jobs/job/{job.pk}/change/")
    with page.expect_navigation():
        page.locator("#cronyard-backfill").click()
    page.select_option("#id_zone", "UTC")
    page.fill("#id_start", slots[0].strftime("%Y-%m-%dT%H:%M:%S"))
    page.fill("#id_end", slots[-1].strftime("%Y-%m-%dT%H:%M:%S"))
    with page.expect_navigation():
        page.locator("#cronyard-backfill-preview").click()
    listed = page.locator("#cronyard-backfill-missing li")
    expect(listed).to_have_count(4)
    assert [li.get_attribute("data-slot") for li in listed.all()] == missing
    expect(page.locator("#cronyard-backfill-present li")).to_have_count(2)
    expect(page.locator("#cronyard-backfill-summary")).to_contain_text("4 slots would get a run")
    assert JobRun.objects.filter(job_id=job.pk).count() == 2  # the preview wrote nothing
    b.screenshot(page, "backfill")

    with page.expect_navigation():
        page.get_by_role("button", name="Backfill 4 runs").click()
    assert page.url.endswith(f"/admin/jobs/job/{job.pk}/change/")
    expect(page.locator(".messagelist li.success")).to_contain_text("Backfilled 4 runs")
    created = JobRun.objects.filter(job_id=job.pk, trigger="backfill")
    assert sorted(z(r.scheduled_at) for r in created) == missing
    assert AuditEntry.objects.get(job_id=job.pk, action="backfill").actor == "admin:admin"
    with page.expect_navigation():
        page.locator(".messagelist li.success a").click()
    expect(page.locator("#result_list tbody tr")).to_have_count(4)

    # A window ending in the future: the field is named, nothing is written.
    page.goto(f"/admin/jobs/job/{job.pk}/backfill/")
    page.fill("#id_end", (top + timedelta(days=1)).strftime("%Y-%m-%dT%H:%M:%S"))
    with page.expect_navigation():
        page.locator("#cronyard-backfill-preview").click()
    expect(page.locator("#cronyard-error-end")).to_contain_text("end: backfill covers past slots only")
    expect(page.locator("#cronyard-backfill-confirm")).to_have_count(0)
    assert JobRun.objects.filter(job_id=job.pk).count() == 6


def test_the_job_form_shows_only_the_chosen_trigger_kinds_fields(signed_in, acme):
    """An interval job's form asks for no zone and no DST menus; choosing Cron brings
    them back and hides the interval; what is hidden is not read when saving."""
    page = signed_in
    job = services.create_job(tenant=acme, fields=dict(name="every minute", interval_seconds=60, target=HOOK))
    page.goto(f"/admin/jobs/job/{job.pk}/edit/")
    expect(page.locator("#id_trigger_kind input[value='interval']")).to_be_checked()
    for hidden in ("cron_expr", "time_zone", "dst_policy", "run_at"):
        expect(page.locator(f".form-row.field-{hidden}")).to_be_hidden()
    expect(page.locator(".form-row.field-interval_seconds")).to_be_visible()
    b.screenshot(page, "job_form_interval", full_page=False)

    page.locator("#id_trigger_kind input[value='cron']").check()
    for shown in ("cron_expr", "time_zone", "dst_policy"):
        expect(page.locator(f".form-row.field-{shown}")).to_be_visible()
    expect(page.locator(".form-row.field-interval_seconds")).to_be_hidden()
    # The interval input still holds 60, hidden: saving a cron job clears it, as a PATCH
    # naming `cron` does, instead of refusing two triggers.
    page.fill("#id_cron_expr", "0 9 * * *")
    page.fill("#id_time_zone", "Europe/Berlin")
    with page.expect_navigation():
        page.click("input[name=_continue]")
    expect(page.locator(".messagelist li.success")).to_be_visible()
    job.refresh_from_db()
    assert (job.cron_expr, job.interval_seconds, job.time_zone) == ("0 9 * * *", None, "Europe/Berlin")
    expect(page.locator("#id_trigger_kind input[value='cron']")).to_be_checked()
    expect(page.locator(".form-row.field-interval_seconds")).to_be_hidden()
