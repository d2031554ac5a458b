"""What a create or an edit means lives in jobs.services (jobs/rules/edits.py), not in the API
serializer or the admin form: these call the services directly, as any caller would."""

from __future__ import annotations

import pytest

from jobs import services
from jobs.models import AuditAction, AuditEntry, Job
from jobs.rules.job import JobInvalid

TARGET = {"type": "task", "name": "noop", "kwargs": {}}


def make_job(tenant, **fields) -> Job:
    return services.create_job(tenant=tenant, fields={"name": "j", "target": TARGET, **fields})


@pytest.mark.django_db
def test_create_fills_the_defaults_and_validates(tenant):
    job = make_job(tenant, interval_seconds=60)
    assert (job.time_zone, job.max_attempts, job.alert_after_failures, job.cron_expr) == ("UTC", 5, 3, "")
    with pytest.raises(JobInvalid) as caught:
        make_job(tenant, interval_seconds=0, cron_expr="0 * * * *")
    assert set(caught.value.errors) == {"schedule"}
    with pytest.raises(JobInvalid) as caught:
        make_job(tenant, interval_seconds=0)
    assert set(caught.value.errors) == {"interval_seconds"}
    assert Job.objects.count() == 1


@pytest.mark.django_db
def test_naming_one_trigger_replaces_the_others(tenant):
    job = make_job(tenant, cron_expr="0 * * * *")
    job = services.update_job(job=job, changes={"interval_seconds": 120})
    job.refresh_from_db()
    assert (job.cron_expr, job.interval_seconds, job.run_at) == ("", 120, None)


@pytest.mark.django_db
def test_an_invalid_edit_is_refused_with_field_errors_and_writes_nothing(tenant):
    job = make_job(tenant, interval_seconds=60)
    with pytest.raises(JobInvalid) as caught:
        services.update_job(job=job, changes={"interval_seconds": 0, "name": "renamed"})
    assert set(caught.value.errors) == {"interval_seconds"}
    job.refresh_from_db()
    assert (job.name, job.interval_seconds) == ("j", 60)
    assert not AuditEntry.objects.filter(job_id=job.id, action=AuditAction.UPDATE).exists()


@pytest.mark.django_db
def test_an_edit_is_judged_on_the_locked_row_not_the_callers_copy(tenant):
    stale = make_job(tenant, interval_seconds=3600)
    services.update_job(job=stale, changes={"jitter_seconds": 3000})
    # `stale` still says jitter 0; shortening the interval under the stored jitter of
    # 3000 s would let one slot's run start after the next slot's.
    with pytest.raises(JobInvalid) as caught:
        services.update_job(job=stale, changes={"interval_seconds": 60})
    assert set(caught.value.errors) == {"jitter_seconds"}
    assert Job.objects.get(pk=stale.pk).interval_seconds == 3600


@pytest.mark.django_db
def test_changing_paused_pauses_and_resumes(tenant):
    job = make_job(tenant, interval_seconds=60)
    job = services.update_job(job=job, changes={"paused": True, "name": "quiet"})
    assert Job.objects.get(pk=job.pk).paused is True
    job = services.update_job(job=job, changes={"paused": False})
    assert Job.objects.get(pk=job.pk).paused is False
    actions = list(AuditEntry.objects.filter(job_id=job.id).order_by("id").values_list("action", flat=True))
    assert actions == [AuditAction.CREATE, AuditAction.UPDATE, AuditAction.PAUSE, AuditAction.RESUME]


@pytest.mark.parametrize(
    ("admin_query", "api_query"),
    [
        ({"cron_expr": "0 9 * * *", "interval_seconds": "60"}, {"cron": "0 9 * * *", "interval_seconds": 60}),
        ({"interval_seconds": "0"}, {"interval_seconds": 0}),
        (
            {"cron_expr": "0 0 30 2 *", "time_zone": "Mars/Olympus"},
            {"cron": "0 0 30 2 *", "timezone": "Mars/Olympus"},
        ),
    ],
)
def test_the_admin_and_api_previews_judge_a_schedule_alike(admin_client, api, admin_query, api_query):
    admin = admin_client.get("/admin/jobs/job/preview/", admin_query)
    answer = api.get("/api/v1/schedules/preview", api_query)
    assert admin.status_code == answer.status_code == 400
    assert admin.json()["error"] == next(iter(answer.json().values()))[0]


@pytest.mark.django_db
def test_an_admin_edit_the_service_refuses_is_a_message_not_a_500(admin_client, tenant, monkeypatch):
    """The service judges an admin edit again on the locked row. If it refuses one the
    form accepted, the admin's transaction rolls back whole and the operator is told."""
    from jobs.admin import jobs
    from jobs.rules.job import JobInvalid
    from tests.support.admin_form import job_form_data

    job = make_job(tenant, interval_seconds=3600, cron_expr="")

    def refuse_after_writing(**kwargs):
        Job.objects.filter(pk=job.pk).update(name="half-written")  # must roll back too
        raise JobInvalid({"interval_seconds": ["refused on the locked row"]})

    monkeypatch.setattr(jobs.services, "update_job", refuse_after_writing)
    url = f"/admin/jobs/job/{job.pk}/edit/"
    response = admin_client.post(
        url, job_form_data(tenant, name="renamed", cron_expr="", interval_seconds="60")
    )
    assert response.status_code == 302 and response.url == url
    page = admin_client.get(url).content.decode()
    assert (
        "Not saved: the job changed while you edited it (interval_seconds: refused on the locked row)" in page
    )
    assert Job.objects.filter(pk=job.pk).values_list("name", "interval_seconds").get() == (job.name, 3600)
