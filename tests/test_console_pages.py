"""Every console page an operator opens, each with rows to show, through Django's test
client: lists, searches and sorts, the job page with its runs and ledger, saves,
confirmations, the dead-letter queue's replay, the dashboard and the audit log.

The point is the SQL behind each page, which `make test-citus` runs against a Citus
cluster too (scripts/dev.py, CITUS_TESTS): Citus refuses joins of distributed tables
on anything but `partition_id`, correlated subqueries beside the `tenants` reference
table, and row locks across shards. What each page shows is tested elsewhere
(test_admin_jobs, test_job_page, test_runs_admin, test_audit); here every page must
answer, and a save must do what it says."""

from __future__ import annotations

import re
from datetime import timedelta

import pytest
from django.contrib.admin.helpers import ACTION_CHECKBOX_NAME
from django.db import connection
from django.test.utils import CaptureQueriesContext
from django.utils import timezone

from jobs import services
from jobs.models import AuditEntry, Job, Misfire, Tenant
from runs.keys import format_utc
from runs.models import JobRun
from tests.support.admin_form import job_form_data
from tests.support.runsapi import make_dead_run, make_job, make_run, minute_slots

pytestmark = pytest.mark.django_db


@pytest.fixture(autouse=True)
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


@pytest.fixture
def console(tenant):
    """Two tenants' jobs with runs of every kind, a misfire and audit entries."""
    from jobs.tenant_services import create_tenant

    other, _ = create_tenant(slug="globex", max_concurrency=3)
    alpha, beta = make_job(tenant, "alpha-report"), make_job(other, "beta-sync")
    slots = minute_slots(4)
    dead = make_dead_run(alpha, slots[0], attempts=2)
    make_run(alpha, slots[1], status="succeeded", attempt=1)
    make_run(beta, slots[2], status="running", attempt=1, owner="exec-1", started_at=slots[2])
    make_run(beta, slots[3])
    Misfire.objects.create(
        job=alpha, partition_id=alpha.partition_id, policy="run_once", missed_count=2,
        first_missed_at=slots[3], last_missed_at=slots[2], runs_created=1,
    )  # fmt: skip
    services.pause_job(job=beta, actor="admin:setup")
    return {"tenant": tenant, "other": other, "alpha": alpha, "beta": beta, "dead": dead}


def ok(response) -> str:
    assert response.status_code == 200, (response.status_code, response.content[:500])
    return response.content.decode()


def redirected(response) -> str:
    assert response.status_code == 302, (response.status_code, response.content[:2000])
    return response["Location"]


LISTS = [
    "/admin/",
    "/admin/jobs/job/",
    "/admin/jobs/job/?q=alpha",
    "/admin/jobs/job/?paused__exact=1",
    "/admin/jobs/job/?trigger=interval&o=6",
    "/admin/jobs/tenant/",
    "/admin/jobs/tenant/?q=glob",
    "/admin/jobs/tenant/?o=-6",
    "/admin/jobs/misfire/",
    "/admin/jobs/misfire/?q=alpha",
    "/admin/jobs/misfire/?o=1",
    "/admin/jobs/schedulernode/",
    "/admin/jobs/auditentry/",
    "/admin/runs/jobrun/",
    "/admin/runs/jobrun/?status__exact=dead",
    "/admin/runs/deadrun/",
    "/admin/runs/jobrun/dashboard/",
    "/admin/runs/executornode/",
]


@pytest.mark.parametrize("url", LISTS)
def test_every_list_page_answers(admin_client, console, url):
    ok(admin_client.get(url))


def test_the_misfire_list_names_the_job_and_finds_it_by_name(admin_client, console):
    assert "alpha-report" in ok(admin_client.get("/admin/jobs/misfire/"))
    assert "alpha-report" in ok(admin_client.get("/admin/jobs/misfire/?q=alpha"))
    assert "alpha-report" not in ok(admin_client.get("/admin/jobs/misfire/?q=beta"))
    assert "alpha-report" in ok(admin_client.get(f"/admin/jobs/misfire/?q={console['alpha'].pk}"))


def test_the_tenant_list_counts_jobs_and_tokens_per_tenant(admin_client, console):
    make_job(console["other"], "beta-two")
    response = admin_client.get("/admin/jobs/tenant/")
    ok(response)
    counts = {t.slug: (t._jobs, t._tokens) for t in response.context["cl"].result_list}
    assert counts == {console["tenant"].slug: (1, 1), "globex": (2, 1)}


def test_the_job_page_its_edit_and_its_confirmations(admin_client, console):
    alpha = console["alpha"]
    page = ok(admin_client.get(f"/admin/jobs/job/{alpha.pk}/change/"))
    # Both panels: the recent runs (the dead run among them) and the ledger's occurrences.
    assert f'data-run="{console["dead"].pk}"' in page and "field-recent_occurrences" in page
    ok(admin_client.get(f"/admin/jobs/job/{alpha.pk}/edit/"))
    data = job_form_data(console["tenant"], name="alpha renamed", cron_expr="", interval_seconds="600")
    redirected(admin_client.post(f"/admin/jobs/job/{alpha.pk}/edit/", data))
    assert Job.objects.get(pk=alpha.pk).name == "alpha renamed"
    for operation in ("pause", "resume", "trigger"):
        url = f"/admin/jobs/job/{alpha.pk}/operate/{operation}/"
        ok(admin_client.get(url))
        redirected(admin_client.post(url, {"catch_up": "none"}))
    assert JobRun.objects.filter(job_id=alpha.pk, trigger="manual").count() == 1
    ok(admin_client.get(f"/admin/jobs/job/{alpha.pk}/history/"))
    # Backfill: the form, the dry run's list (the present slots' runs read by their key), the insert.
    backfill = f"/admin/jobs/job/{alpha.pk}/backfill/"
    ok(admin_client.get(backfill))
    now = timezone.now()
    start, end = format_utc(now - timedelta(hours=3)), format_utc(now - timedelta(minutes=1))
    window = {"start": start, "end": end, "zone": "UTC"}  # ISO instants: read as written
    assert "cronyard-backfill-confirm" in ok(admin_client.get(backfill, {**window, "preview": "1"}))
    redirected(admin_client.post(backfill, window))
    assert JobRun.objects.filter(job_id=alpha.pk, trigger="backfill").count() >= 2


def test_the_job_list_bulk_actions(admin_client, console):
    ids = [console["alpha"].pk, console["beta"].pk]
    for action in ("pause_jobs", "resume_jobs", "trigger_now"):
        redirected(admin_client.post("/admin/jobs/job/", {"action": action, ACTION_CHECKBOX_NAME: ids}))
    assert JobRun.objects.filter(job_id__in=ids, trigger="manual").count() == 2


def test_a_job_is_added_and_deleted_from_the_console(admin_client, console):
    redirected(admin_client.post("/admin/jobs/job/add/", job_form_data(console["tenant"], name="added")))
    added = Job.objects.get(name="added")
    alpha = console["alpha"]
    page = ok(admin_client.get(f"/admin/jobs/job/{alpha.pk}/delete/"))
    assert "alpha-report" in page and "Misfire" in page
    redirected(admin_client.post(f"/admin/jobs/job/{alpha.pk}/delete/", {"post": "yes"}))
    assert not Job.objects.filter(pk=alpha.pk).exists()
    assert not Misfire.objects.filter(job_id=alpha.pk).exists()
    assert not JobRun.objects.filter(job_id=alpha.pk).exists()
    assert Job.objects.filter(pk=added.pk).exists()


def test_the_tenant_page_and_its_save(admin_client, console):
    other = console["other"]
    url = f"/admin/jobs/tenant/{other.pk}/change/"
    ok(admin_client.get(url))
    data = {
        "slug": other.slug, "name": "Globex Corp", "max_concurrency": "7", "weight": "2",
        "max_runs_per_minute": "", "tokens-TOTAL_FORMS": "1", "tokens-INITIAL_FORMS": "1",
        "tokens-MIN_NUM_FORMS": "0", "tokens-MAX_NUM_FORMS": "1000",
        "tokens-0-id": str(other.tokens.get().pk), "tokens-0-tenant": str(other.pk),
    }  # fmt: skip
    redirected(admin_client.post(url, data))
    other.refresh_from_db()
    assert (other.name, other.max_concurrency, other.weight) == ("Globex Corp", 7, 2)
    new = {
        **data,
        "slug": "initech",
        "name": "Initech",
        "tokens-TOTAL_FORMS": "0",
        "tokens-INITIAL_FORMS": "0",
    }
    redirected(admin_client.post("/admin/jobs/tenant/add/", new))
    assert Tenant.objects.filter(slug="initech").exists()


def test_a_tenant_with_jobs_cannot_be_deleted_and_an_empty_one_can(admin_client, console):
    """Runs have no foreign key to their job, so a cascade from the tenant would leave its
    queued runs behind for executors to call. A tenant goes only once its jobs are gone
    (each job's delete takes its runs); the page says so instead of a cascade list."""
    other = console["other"]
    url = f"/admin/jobs/tenant/{other.pk}/delete/"
    page = ok(admin_client.get(url))
    assert "2 jobs" not in page and "1 job" in page and "delete its jobs first" in page
    bulk = {"action": "delete_selected", ACTION_CHECKBOX_NAME: [str(other.pk)]}
    page = ok(admin_client.post("/admin/jobs/tenant/", bulk))
    assert "1 job" in page and "delete its jobs first" in page and 'name="post"' not in page
    # "Yes" despite the jobs is the next test's (a job created after the confirmation).

    services.delete_job(job=console["beta"], actor="admin:setup")
    page = ok(admin_client.get(url))
    assert "delete its jobs first" not in page
    # "Yes" counts the tenant's jobs once, in the service under the tenant's lock.
    with CaptureQueriesContext(connection) as queries:
        redirected(admin_client.post(url, {"post": "yes"}))
    counts = [q["sql"] for q in queries if re.search(r'COUNT\(\*\).* FROM "jobs"', q["sql"])]
    assert len(counts) == 1, counts
    assert not Tenant.objects.filter(pk=other.pk).exists()
    assert not JobRun.objects.filter(tenant_id=other.pk).exists()
    assert Tenant.objects.filter(pk=console["tenant"].pk).exists()


def test_the_run_page_and_the_dead_letter_replay(admin_client, console):
    dead = console["dead"]
    ok(admin_client.get(f"/admin/runs/jobrun/{dead.pk}/change/"))
    ok(admin_client.get(f"/admin/runs/deadrun/{dead.pk}/change/"))
    redirected(admin_client.post(f"/admin/runs/deadrun/{dead.pk}/replay/"))
    assert JobRun.objects.get(pk=dead.pk).status == "queued"
    queued = JobRun.objects.filter(job_id=console["beta"].pk, status="queued").get()
    redirected(admin_client.post(f"/admin/runs/jobrun/{queued.pk}/cancel/"))
    assert JobRun.objects.get(pk=queued.pk).status == "cancelled"
    response = admin_client.post(
        "/admin/runs/jobrun/",
        {"action": "replay_selected", "confirmed": "yes", ACTION_CHECKBOX_NAME: [queued.pk]},
        follow=True,
    )
    ok(response)
    assert JobRun.objects.get(pk=queued.pk).status == "queued"


def test_an_objects_page_reads_its_object_once(admin_client, console):
    """The title (the object's name) and the page's buttons come from the object Django
    loads for the form, not from loads of their own."""
    entry = AuditEntry.objects.order_by("id").first()
    pages = {
        f"/admin/jobs/job/{console['alpha'].pk}/edit/": ("jobs", console["alpha"].pk.hex),
        f"/admin/jobs/tenant/{console['other'].pk}/change/": ("tenants", console["other"].pk),
        f"/admin/runs/jobrun/{console['dead'].pk}/change/": ("runs", console["dead"].pk),
        f"/admin/runs/deadrun/{console['dead'].pk}/change/": ("runs", console["dead"].pk),
        f"/admin/jobs/auditentry/{entry.pk}/change/": ("audit_entries", entry.pk),
    }
    loads = {}
    for url, (table, pk) in pages.items():
        with CaptureQueriesContext(connection) as queries:
            page = ok(admin_client.get(url))
        by_key = re.compile(rf'^SELECT "{table}"\."id", .* WHERE .*"{table}"\."id" = \'?{pk}\b')
        loads[url] = sum(1 for q in queries if by_key.search(q["sql"]))
        assert "<title>Change " not in page and "<title>View " not in page  # titled by the object
    assert loads == {url: 1 for url in pages}, loads
    dead = ok(admin_client.get(f"/admin/runs/jobrun/{console['dead'].pk}/change/"))
    assert "Run of alpha-report at " in dead and "Replay" in dead


def test_the_audit_log_and_an_entry(admin_client, console):
    entry = AuditEntry.objects.order_by("-id").first()
    ok(admin_client.get(f"/admin/jobs/auditentry/{entry.pk}/change/"))
    ok(admin_client.get(f"/admin/jobs/auditentry/?q={console['beta'].pk}"))


def test_a_tenant_that_gains_a_job_after_the_confirmation_is_kept_with_a_message(admin_client, console):
    """The page's check and the delete are apart: a job created between them makes the
    service refuse, and the console says so instead of a 500 (one tenant or in bulk)."""
    other = console["other"]
    # As if the confirmation page had been shown before the tenant's job existed: "Yes".
    response = admin_client.post(f"/admin/jobs/tenant/{other.pk}/delete/", {"post": "yes"}, follow=True)
    assert response.status_code == 200
    assert "Not deleted: the tenant still has 1 job: delete its jobs first." in response.content.decode()
    bulk = {"action": "delete_selected", ACTION_CHECKBOX_NAME: [str(other.pk)], "post": "yes"}
    response = admin_client.post("/admin/jobs/tenant/", bulk, follow=True)
    assert "Not deleted, they have jobs: globex." in response.content.decode()
    assert Tenant.objects.filter(pk=other.pk).exists()
    assert JobRun.objects.filter(tenant_id=other.pk).count() == 2
