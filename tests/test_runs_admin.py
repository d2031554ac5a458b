"""Runs admin: the runs list and its filters, the dead-letter queue, replay/cancel actions
(audited as LogEntry rows), the read-only run page, and the operations dashboard."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.contrib.admin.models import CHANGE, LogEntry
from django.utils import timezone

from jobs.models import Job, SchedulerNode
from runs.attempts import history
from runs.models import JobRun
from tests.support import nodes
from tests.support.runsapi import make_dead_run, make_job, make_run, minute_slots

pytestmark = pytest.mark.django_db


@pytest.fixture
def runs(tenant):
    """A known mix: 2 dead, 1 cancelled, 1 queued, 1 running, 1 succeeded (manual)."""
    from jobs.tenant_services import create_tenant

    other_tenant, _ = create_tenant(slug="globex", max_concurrency=3)
    alpha, beta = make_job(tenant, "alpha-report"), make_job(other_tenant, "beta-sync")
    slots = minute_slots(6)
    return {
        "alpha": alpha,
        "beta": beta,
        "dead_a": make_dead_run(alpha, slots[0], attempts=3),
        "dead_b": make_dead_run(beta, slots[1], attempts=2),
        "cancelled": make_run(alpha, slots[2], status="cancelled", attempt=1, finished_at=slots[2]),
        "queued": make_run(alpha, slots[3]),
        "running": make_run(beta, slots[4], status="running", attempt=1, owner="exec-1", started_at=slots[4]),
        "succeeded": make_run(alpha, slots[5], status="succeeded", attempt=1, trigger="manual"),
    }


def listed(response) -> set[int]:
    assert response.status_code == 200
    return {run.pk for run in response.context["cl"].result_list}


def test_runs_changelist_and_filters(admin_client, runs):
    url = "/admin/runs/jobrun/"
    everything = listed(admin_client.get(url))
    assert everything == {r.pk for k, r in runs.items() if isinstance(r, JobRun)}
    page = admin_client.get(url).content.decode()
    assert "alpha-report" in page and "beta-sync" in page and "Dead-letter queue" in page

    assert listed(admin_client.get(url, {"status__exact": "dead"})) == {runs["dead_a"].pk, runs["dead_b"].pk}
    assert listed(admin_client.get(url, {"trigger__exact": "manual"})) == {runs["succeeded"].pk}
    assert listed(admin_client.get(url, {"tenant__id__exact": runs["beta"].tenant_id})) == {
        runs["dead_b"].pk,
        runs["running"].pk,
    }
    assert listed(admin_client.get(url, {"q": "beta"})) == {runs["dead_b"].pk, runs["running"].pk}
    assert listed(admin_client.get(url, {"q": str(runs["alpha"].id)})) == {
        runs[k].pk for k in ("dead_a", "cancelled", "queued", "succeeded")
    }
    assert listed(admin_client.get(url, {"q": runs["queued"].run_key})) == {runs["queued"].pk}
    assert listed(admin_client.get(url, {"q": f"{runs['alpha'].id}/garbage"})) == set()


def test_changelist_never_counts_the_whole_table(admin_client, runs):
    from django.db import connection
    from django.test.utils import CaptureQueriesContext

    with CaptureQueriesContext(connection) as queries:
        assert admin_client.get("/admin/runs/jobrun/", {"status__exact": "dead"}).status_code == 200
    counts = [
        q["sql"] for q in queries.captured_queries if "COUNT(" in q["sql"].upper() and '"runs"' in q["sql"]
    ]
    assert counts and all("LIMIT" in sql.upper() for sql in counts), counts


def test_dead_letter_page_lists_only_dead_runs(admin_client, runs):
    response = admin_client.get("/admin/runs/deadrun/")
    assert listed(response) == {runs["dead_a"].pk, runs["dead_b"].pk}
    assert "HTTP 500" in response.content.decode()  # the last error column
    assert admin_client.get(f"/admin/runs/deadrun/{runs['queued'].pk}/change/").status_code == 302  # not dead


def test_bulk_replay_action_replays_only_dead_and_cancelled_and_is_audited(admin_client, runs):
    chosen = [runs[k].pk for k in ("dead_a", "dead_b", "cancelled", "running", "succeeded")]
    # Unconfirmed, the action asks: the page names every selected run and posts them all back.
    asked = admin_client.post(
        "/admin/runs/jobrun/", {"action": "replay_selected", ACTION_CHECKBOX_NAME: chosen}
    )
    page = asked.content.decode()
    assert asked.status_code == 200 and "Yes, replay" in page and 'name="confirmed" value="yes"' in page
    assert all(f'name="_selected_action" value="{pk}"' in page for pk in chosen)
    assert all(runs[k].run_key in page for k in ("dead_a", "dead_b", "cancelled", "running", "succeeded"))
    assert JobRun.objects.get(pk=runs["dead_a"].pk).status == "dead" and not LogEntry.objects.exists()
    response = admin_client.post(
        "/admin/runs/jobrun/",
        {"action": "replay_selected", "confirmed": "yes", ACTION_CHECKBOX_NAME: chosen},
        follow=True,
    )
    assert response.status_code == 200
    assert "Replayed 3 run(s); ignored 2 that were not dead or cancelled." in response.content.decode()
    status = dict(JobRun.objects.values_list("pk", "status"))
    assert [status[pk] for pk in chosen] == ["queued", "queued", "queued", "running", "succeeded"]
    assert JobRun.objects.get(pk=runs["dead_a"].pk).attempt == 3  # attempt keeps counting

    entries = LogEntry.objects.filter(action_flag=CHANGE)
    assert sorted(int(e.object_id) for e in entries) == sorted(chosen[:3])
    assert {e.user.username for e in entries} == {"admin"}
    assert all("Replayed" in e.get_change_message() for e in entries)


def test_bulk_replay_from_the_dead_letter_queue(admin_client, runs):
    response = admin_client.post(
        "/admin/runs/deadrun/",
        {
            "action": "replay_selected",
            "confirmed": "yes",
            ACTION_CHECKBOX_NAME: [runs["dead_a"].pk, runs["dead_b"].pk],
        },
        follow=True,
    )
    assert "Replayed 2 run(s); ignored 0" in response.content.decode()
    assert listed(admin_client.get("/admin/runs/deadrun/")) == set()
    assert LogEntry.objects.count() == 2
    # Audited against the run itself, so its history page shows it.
    assert {e.content_type.model for e in LogEntry.objects.all()} == {"jobrun"}
    history = admin_client.get(f"/admin/runs/jobrun/{runs['dead_a'].pk}/history/").content.decode()
    assert "Replayed: re-queued under the same run key." in history


def test_bulk_cancel_action(admin_client, runs):
    chosen = [runs[k].pk for k in ("queued", "running", "dead_a")]
    response = admin_client.post(
        "/admin/runs/jobrun/",
        {"action": "cancel_selected", "confirmed": "yes", ACTION_CHECKBOX_NAME: chosen},
        follow=True,
    )
    assert "Cancelled 2 run(s); ignored 1 that were already finished." in response.content.decode()
    queued, running = JobRun.objects.get(pk=runs["queued"].pk), JobRun.objects.get(pk=runs["running"].pk)
    assert queued.status == running.status == "cancelled"
    assert queued.last_error == "cancelled by admin:admin"
    assert history(running)[-1]["outcome"] == "cancelled"
    assert LogEntry.objects.count() == 2


def test_run_page_is_read_only_with_attempts_and_redacted_target(admin_client, runs):
    dead = runs["dead_a"]
    url = f"/admin/runs/jobrun/{dead.pk}/change/"
    page = admin_client.get(url).content.decode()
    assert 'class="attempts"' in page and page.count("<tr><td>") >= 3  # one row per attempt
    assert "very-secret" not in page and "k-123" not in page and "&quot;***&quot;" in page
    assert dead.run_key in page
    assert f"/admin/runs/jobrun/{dead.pk}/replay/" in page  # the replay button
    assert f"/admin/runs/jobrun/{dead.pk}/cancel/" not in page  # dead runs cannot be cancelled
    assert 'name="_save"' not in page

    # A form post cannot rewrite the row the executors update.
    assert admin_client.post(url, {"status": "succeeded"}).status_code == 403
    assert JobRun.objects.get(pk=dead.pk).status == "dead"
    assert admin_client.get("/admin/runs/jobrun/add/").status_code == 403


def test_a_run_shows_the_attempts_it_used_as_the_api_does(admin_client, api, runs):
    """The attempt number is the claim's fence; a claim put back unsent (an open breaker,
    a spent retry budget) used no attempt. Console and API both say how many were used."""
    run = make_run(
        runs["alpha"], minute_slots(7)[6], status="retrying", attempt=4, deferrals=2, max_attempts=5
    )
    field = r'<div class="readonly">{}</div>'
    page = admin_client.get(f"/admin/runs/jobrun/{run.pk}/change/").content.decode()
    assert re.search(field.format(r"2 / 5"), page), re.findall(field.format(r"\d+ / \d+"), page)
    listed_page = admin_client.get("/admin/runs/jobrun/", {"status__exact": "retrying"}).content.decode()
    assert re.search(r'<td class="field-attempt_text">2 / 5</td>', listed_page)
    (shown,) = api.get("/api/v1/runs/", {"job": str(runs["alpha"].pk), "status": "retrying"}).json()[
        "results"
    ]
    assert (shown["attempt"], shown["attempts_used"], shown["max_attempts"]) == (4, 2, 5)


def test_single_replay_and_cancel_buttons(admin_client, runs):
    dead = runs["dead_b"]
    # A GET asks (what will happen, to which run) and changes nothing.
    asked = admin_client.get(f"/admin/runs/deadrun/{dead.pk}/replay/")
    assert asked.status_code == 200
    assert dead.run_key in asked.content.decode() and "Yes, replay" in asked.content.decode()
    assert JobRun.objects.get(pk=dead.pk).status == "dead" and not LogEntry.objects.exists()
    assert admin_client.put(f"/admin/runs/deadrun/{dead.pk}/replay/").status_code == 405
    response = admin_client.post(f"/admin/runs/deadrun/{dead.pk}/replay/")
    assert response.status_code == 302 and response["Location"] == f"/admin/runs/jobrun/{dead.pk}/change/"
    assert JobRun.objects.get(pk=dead.pk).status == "queued"
    (entry,) = LogEntry.objects.all()
    assert entry.object_id == str(dead.pk) and "Replayed" in entry.get_change_message()

    # Replaying it again is refused with a message, and audited nothing.
    response = admin_client.post(f"/admin/runs/jobrun/{dead.pk}/replay/", follow=True)
    assert "Cannot replay a queued run" in response.content.decode()
    assert LogEntry.objects.count() == 1

    admin_client.post(f"/admin/runs/jobrun/{runs['queued'].pk}/cancel/")
    assert JobRun.objects.get(pk=runs["queued"].pk).status == "cancelled"
    assert LogEntry.objects.count() == 2


def test_non_staff_cannot_reach_runs_admin(client, django_user_model, runs):
    django_user_model.objects.create_user(username="joe", password="pw")
    client.login(username="joe", password="pw")
    for url in ("/admin/runs/jobrun/", "/admin/runs/jobrun/dashboard/", "/admin/runs/deadrun/"):
        assert client.get(url).status_code == 302  # to the login page
    assert client.post(f"/admin/runs/jobrun/{runs['dead_a'].pk}/replay/").status_code == 302
    assert JobRun.objects.get(pk=runs["dead_a"].pk).status == "dead"


def metric(page: str, name: str) -> str:
    match = re.search(rf'data-metric="{name}">([^<]*)<', page)
    assert match, f"{name} not on the dashboard"
    return match.group(1).strip()


def test_dashboard_shows_the_database_state(admin_client, runs, tenant):
    now = timezone.now()
    # Lateness: two unpaused jobs overdue (the oldest by 600 s); a paused one older still.
    late = [make_job(tenant, f"late-{i}") for i in range(3)]
    Job.objects.filter(pk=late[0].pk).update(next_run_at=now - timedelta(seconds=600))
    Job.objects.filter(pk=late[1].pk).update(next_run_at=now - timedelta(seconds=30))
    Job.objects.filter(pk=late[2].pk).update(next_run_at=now - timedelta(hours=5), paused=True)
    # Queue: beyond the fixture's queued (p0) and running (p0) rows, three queued at p7.
    for moment in minute_slots(3, end=now.replace(microsecond=0) - timedelta(minutes=30)):
        make_run(late[0], moment, priority=7)
    SchedulerNode.objects.create(
        node_id="node-a", hostname="h1", pid=11, started_at=now, heartbeat_at=now, partitions=list(range(200))
    )
    SchedulerNode.objects.create(
        node_id="node-b",
        hostname="h2",
        pid=12,
        started_at=now - timedelta(hours=1),
        heartbeat_at=now - timedelta(minutes=10),
        partitions=list(range(200, 256)),
    )
    admin_client.post(  # something for the audit log
        "/admin/runs/jobrun/",
        {"action": "replay_selected", "confirmed": "yes", ACTION_CHECKBOX_NAME: [runs["dead_a"].pk]},
    )

    # node-b is connected but silent for 10 minutes: stale by the heartbeat half of the rule.
    with nodes.sessions("node-a", "node-b"):
        response = admin_client.get("/admin/runs/jobrun/dashboard/")
    assert response.status_code == 200
    page = response.content.decode()
    # The console's duration rule on the page; the exact seconds in data-seconds.
    assert re.fullmatch(r"10 min( \d+ s)?", metric(page, "oldest_due_seconds"))
    seconds = re.search(r'data-seconds="([\d.]+)" data-metric="oldest_due_seconds"', page)
    assert 600 <= float(seconds.group(1)) < 660
    assert metric(page, "due_jobs") == "2"
    # Columns are queued, running, retrying: queued = 1 (fixture) + 3 (p7) + 1 replayed.
    assert [metric(page, f"depth_{i}") for i in range(3)] == ["5", "1", "0"]
    assert re.search(r'data-priority="7"><td>7</td><td>3</td><td>0</td><td>0</td><td>3</td>', page)
    # All fixture runs are in the last six minutes; the three p7 runs 30+ minutes ago.
    assert metric(page, "last_hour_total") == "9"
    assert metric(page, "last_hour_queued") == "5"  # 1 + 3 + the one just replayed
    assert metric(page, "last_hour_dead") == "1"
    assert metric(page, "dead_last_day") == "1"
    assert metric(page, "live_nodes") == "1"
    assert metric(page, "unowned_partitions") == "56"  # node-b is stale
    assert re.search(r'data-node="node-b"[^>]*>.*?stale', page, re.S)
    assert re.search(r'data-tenant="acme"><td>acme</td>\s*<td[^>]*>0 / 10</td>\s*<td>5</td>', page)
    assert re.search(r'data-tenant="globex"><td>globex</td>\s*<td[^>]*>1 / 3</td>\s*<td>0</td>', page)
    # Recent changes are the audit log's: the replay above, by the admin.
    assert re.search(r"<td>admin:admin</td>\s*<td>[^<]*</td>\s*<td>Replay</td>", page)


def test_admin_index_links_the_dashboard(admin_client, runs):
    page = admin_client.get("/admin/").content.decode()
    assert "/admin/runs/jobrun/dashboard/" in page and "/admin/runs/deadrun/" in page
    assert "Dead-letter queue" in page and ">Runs</a>" in page  # the app list is still there
