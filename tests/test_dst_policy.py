"""Per-job DST policy: the table of every policy x zone vector, the
notes previews show, the scheduler's slot arithmetic, and field-level 400s.

Vectors (2026), worked out from the tz rules, not from the implementation:

* America/New_York: 11-01 02:00 EDT -> 01:00 EST (06:00Z); 03-08 02:00 EST -> 03:00 EDT (07:00Z).
* Europe/London: 10-25 02:00 BST -> 01:00 GMT (01:00Z); 03-29 01:00 GMT -> 02:00 BST (01:00Z).
* Australia/Lord_Howe (30-minute shift): 04-05 02:00 +11 -> 01:30 +10:30 (04-04 15:00Z);
  10-04 02:00 +10:30 -> 02:30 +11 (10-03 15:30Z).
* Pacific/Chatham (:45 offsets): 04-05 03:45 +13:45 -> 02:45 +12:45 (04-04 14:00Z);
  09-27 02:45 +12:45 -> 03:45 +13:45 (09-26 14:00Z).
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from jobs import services
from jobs.dispatch import planning
from jobs.models import Job
from jobs.schedule import fire_times
from runs.keys import format_utc, parse_utc
from tests.support.admin_form import job_form_data
from tests.support.clock import travel

NY, LONDON, LORD_HOWE, CHATHAM = "America/New_York", "Europe/London", "Australia/Lord_Howe", "Pacific/Chatham"
HOOK = {"type": "http", "url": "https://example.com/hook"}


def z(text: str) -> datetime:
    return parse_utc(text)


def fires(expr: str, tz: str, after: str, policy: dict | None, count: int = 3):
    return fire_times(
        cron=expr,
        timezone=tz,
        interval_seconds=None,
        run_at=None,
        anchor=None,
        after=z(after),
        count=count,
        dst_policy=policy,
    )


# (zone, expression, after, policy, expected first fire times (UTC))
REPEATED = [
    # Fixed-time: the wall time happens twice.
    (NY, "30 1 * * *", "2026-10-31T12:00:00Z", "first", ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]),
    (NY, "30 1 * * *", "2026-10-31T12:00:00Z", "last", ["2026-11-01T06:30:00Z", "2026-11-02T06:30:00Z"]),
    (
        NY,
        "30 1 * * *",
        "2026-10-31T12:00:00Z",
        "both",
        ["2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z", "2026-11-02T06:30:00Z"],
    ),
    (LONDON, "30 1 * * *", "2026-10-24T12:00:00Z", "first", ["2026-10-25T00:30:00Z", "2026-10-26T01:30:00Z"]),
    (LONDON, "30 1 * * *", "2026-10-24T12:00:00Z", "last", ["2026-10-25T01:30:00Z", "2026-10-26T01:30:00Z"]),
    (
        LONDON,
        "30 1 * * *",
        "2026-10-24T12:00:00Z",
        "both",
        ["2026-10-25T00:30:00Z", "2026-10-25T01:30:00Z", "2026-10-26T01:30:00Z"],
    ),
    # Lord Howe repeats only 01:30-02:00: 01:45 +11 = 14:45Z, 01:45 +10:30 = 15:15Z.
    (
        LORD_HOWE,
        "45 1 * * *",
        "2026-04-04T00:00:00Z",
        "first",
        ["2026-04-04T14:45:00Z", "2026-04-05T15:15:00Z"],
    ),
    (
        LORD_HOWE,
        "45 1 * * *",
        "2026-04-04T00:00:00Z",
        "last",
        ["2026-04-04T15:15:00Z", "2026-04-05T15:15:00Z"],
    ),
    (
        LORD_HOWE,
        "45 1 * * *",
        "2026-04-04T00:00:00Z",
        "both",
        ["2026-04-04T14:45:00Z", "2026-04-04T15:15:00Z", "2026-04-05T15:15:00Z"],
    ),
    # Chatham repeats 02:45-03:45: 03:00 +13:45 = 13:15Z, 03:00 +12:45 = 14:15Z.
    (CHATHAM, "0 3 * * *", "2026-04-04T00:00:00Z", "first", ["2026-04-04T13:15:00Z", "2026-04-05T14:15:00Z"]),
    (CHATHAM, "0 3 * * *", "2026-04-04T00:00:00Z", "last", ["2026-04-04T14:15:00Z", "2026-04-05T14:15:00Z"]),
    (
        CHATHAM,
        "0 3 * * *",
        "2026-04-04T00:00:00Z",
        "both",
        ["2026-04-04T13:15:00Z", "2026-04-04T14:15:00Z", "2026-04-05T14:15:00Z"],
    ),
    # Elapsed-time: the policy overrides "both instances".
    (
        NY,
        "0 * * * *",
        "2026-11-01T04:30:00Z",
        "first",
        ["2026-11-01T05:00:00Z", "2026-11-01T07:00:00Z", "2026-11-01T08:00:00Z"],
    ),
    (
        NY,
        "0 * * * *",
        "2026-11-01T04:30:00Z",
        "last",
        ["2026-11-01T06:00:00Z", "2026-11-01T07:00:00Z", "2026-11-01T08:00:00Z"],
    ),
    (
        NY,
        "0 * * * *",
        "2026-11-01T04:30:00Z",
        "both",
        ["2026-11-01T05:00:00Z", "2026-11-01T06:00:00Z", "2026-11-01T07:00:00Z"],
    ),
]

MISSING = [
    (NY, "30 2 * * *", "2026-03-07T12:00:00Z", "shift", ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]),
    (NY, "30 2 * * *", "2026-03-07T12:00:00Z", "skip", ["2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"]),
    (LONDON, "30 1 * * *", "2026-03-28T12:00:00Z", "shift", ["2026-03-29T01:00:00Z", "2026-03-30T00:30:00Z"]),
    (LONDON, "30 1 * * *", "2026-03-28T12:00:00Z", "skip", ["2026-03-30T00:30:00Z", "2026-03-31T00:30:00Z"]),
    # Lord Howe skips 02:00-02:30 only: 02:15 is gone, 02:30 +11 = 15:30Z is the gap's end.
    (
        LORD_HOWE,
        "15 2 * * *",
        "2026-10-03T00:00:00Z",
        "shift",
        ["2026-10-03T15:30:00Z", "2026-10-04T15:15:00Z"],
    ),
    (
        LORD_HOWE,
        "15 2 * * *",
        "2026-10-03T00:00:00Z",
        "skip",
        ["2026-10-04T15:15:00Z", "2026-10-05T15:15:00Z"],
    ),
    # Chatham skips 02:45-03:45: 03:00 shifts to 03:45 +13:45 = 14:00Z.
    (CHATHAM, "0 3 * * *", "2026-09-26T00:00:00Z", "shift", ["2026-09-26T14:00:00Z", "2026-09-27T13:15:00Z"]),
    (CHATHAM, "0 3 * * *", "2026-09-26T00:00:00Z", "skip", ["2026-09-27T13:15:00Z", "2026-09-28T13:15:00Z"]),
    # Elapsed-time: "shift" brings back slots the Debian rule drops (merged into one).
    (
        NY,
        "*/20 2 * * *",
        "2026-03-08T05:00:00Z",
        "shift",
        ["2026-03-08T07:00:00Z", "2026-03-09T06:00:00Z", "2026-03-09T06:20:00Z"],
    ),
    (
        NY,
        "*/20 2 * * *",
        "2026-03-08T05:00:00Z",
        "skip",
        ["2026-03-09T06:00:00Z", "2026-03-09T06:20:00Z", "2026-03-09T06:40:00Z"],
    ),
]


def _ids(rows) -> list[str]:
    return [f"{zone.split('/')[-1]}-{expr.replace(' ', '_')}-{policy}" for zone, expr, _, policy, _ in rows]


@pytest.mark.parametrize(("zone", "expr", "after", "policy", "expected"), REPEATED, ids=_ids(REPEATED))
def test_repeated_policy_table(zone, expr, after, policy, expected) -> None:
    got = fires(expr, zone, after, {"repeated": policy}, count=len(expected))
    assert [format_utc(f.utc) for f in got] == expected
    # The entry the overlap affected says what happened, naming the policy.
    affected = [f for f in got if f.utc.date() == got[0].utc.date() and f.note]
    assert affected and all(f"policy '{policy}'" in f.note and "happens twice" in f.note for f in affected)


@pytest.mark.parametrize(("zone", "expr", "after", "policy", "expected"), MISSING, ids=_ids(MISSING))
def test_missing_policy_table(zone, expr, after, policy, expected) -> None:
    got = fires(expr, zone, after, {"missing": policy}, count=len(expected))
    assert [format_utc(f.utc) for f in got] == expected
    # Shifted: the shifted entry; skipped: the next entry (the slot has none of its own).
    assert f"policy '{policy}'" in got[0].note and "does not exist" in got[0].note
    assert all(f.note is None for f in got[1:])


def test_reference_notes_spell_out_the_instant() -> None:
    (last,) = fires("30 1 * * *", NY, "2026-10-31T12:00:00Z", {"repeated": "last"}, count=1)
    assert last.note == (
        "DST overlap: 01:30 happens twice on 2026-11-01; policy 'last': fired at the second, 06:30Z"
    )
    (skipped,) = fires("30 2 * * *", NY, "2026-03-07T12:00:00Z", {"missing": "skip"}, count=1)
    assert (
        skipped.note == "DST gap: 02:30 does not exist on 2026-03-08; policy 'skip': that slot was not fired"
    )


def test_unset_keys_keep_the_debian_rule_of_the_job_kind() -> None:
    # Fixed-time default first/shift, elapsed-time default both/skip; {} and None alike.
    for policy in (None, {}, {"repeated": None, "missing": None}):
        assert [f.utc for f in fires("30 1 * * *", NY, "2026-10-31T12:00:00Z", policy, 2)] == [
            z("2026-11-01T05:30:00Z"),
            z("2026-11-02T06:30:00Z"),
        ]
        assert [f.utc for f in fires("0 * * * *", NY, "2026-11-01T04:30:00Z", policy, 2)] == [
            z("2026-11-01T05:00:00Z"),
            z("2026-11-01T06:00:00Z"),
        ]
        assert [f.utc for f in fires("0 * * * *", NY, "2026-03-08T05:30:00Z", policy, 2)] == [
            z("2026-03-08T06:00:00Z"),
            z("2026-03-08T07:00:00Z"),
        ]
    # Setting one key leaves the other at the kind's default: elapsed + last still skips gaps.
    got = fires("*/30 2 * * *", NY, "2026-03-08T05:00:00Z", {"repeated": "last"}, 1)
    assert got[0].utc == z("2026-03-09T06:00:00Z")


def test_policy_last_restarted_inside_the_overlap_does_not_refire() -> None:
    # A scheduler that restarts between the two 01:30s with policy 'both' fires only the second.
    got = fires("30 1 * * *", NY, "2026-11-01T05:30:00Z", {"repeated": "both"}, count=2)
    assert [format_utc(f.utc) for f in got] == ["2026-11-01T06:30:00Z", "2026-11-02T06:30:00Z"]
    got = fires("30 1 * * *", NY, "2026-11-01T05:45:00Z", {"repeated": "last"}, count=1)
    assert [format_utc(f.utc) for f in got] == ["2026-11-01T06:30:00Z"]


# --------------------------------------------------------------------------
# The scheduler's slot arithmetic (planning) follows the job's policy
# --------------------------------------------------------------------------


@pytest.mark.django_db
def test_scheduler_plans_follow_the_jobs_policy(tenant) -> None:
    now = z("2026-10-31T12:00:00Z")
    job = services.create_job(
        tenant=tenant,
        now=now,
        fields=dict(
            name="both", cron_expr="30 1 * * *", time_zone=NY, target=HOOK, dst_policy={"repeated": "both"}
        ),
    )
    assert job.next_run_at == z("2026-11-01T05:30:00Z")
    plan = planning.plan_job(job, now=job.next_run_at, threshold=timedelta(minutes=1))
    assert [r.scheduled_at for r in plan.runs] == [z("2026-11-01T05:30:00Z")]
    assert plan.new_next == z("2026-11-01T06:30:00Z")

    last = services.create_job(
        tenant=tenant,
        now=now,
        fields=dict(
            name="last", cron_expr="30 1 * * *", time_zone=NY, target=HOOK, dst_policy={"repeated": "last"}
        ),
    )
    assert last.next_run_at == z("2026-11-01T06:30:00Z")
    assert planning.slots_between(last, after=now, until=z("2026-11-03T00:00:00Z"), limit=10) == [
        z("2026-11-01T06:30:00Z"),
        z("2026-11-02T06:30:00Z"),
    ]


@pytest.mark.django_db
def test_changing_the_policy_moves_next_run_at(tenant) -> None:
    now = z("2026-03-07T12:00:00Z")
    job = services.create_job(
        tenant=tenant, now=now, fields=dict(name="gap", cron_expr="30 2 * * *", time_zone=NY, target=HOOK)
    )
    assert job.next_run_at == z("2026-03-08T07:00:00Z")
    job = services.update_job(job=job, changes={"dst_policy": {"missing": "skip"}}, now=now)
    assert job.next_run_at == z("2026-03-09T06:30:00Z")


# --------------------------------------------------------------------------
# API: the field, previews, 400s
# --------------------------------------------------------------------------

PREVIEW = "/api/v1/schedules/preview"


def test_api_stores_and_shows_the_policy(api) -> None:
    with travel("2026-10-31T12:00:00Z"):
        response = api.post(
            "/api/v1/jobs/",
            {
                "name": "p",
                "cron": "30 1 * * *",
                "timezone": NY,
                "target": HOOK,
                "dst_policy": {"repeated": "last"},
            },
            format="json",
        )
        assert response.status_code == 201, response.content
        job = response.json()
        assert job["dst_policy"] == {"repeated": "last", "missing": None}
        assert job["dst_policy_effective"] == {"repeated": "last", "missing": "shift"}
        assert job["next_run_at"] == "2026-11-01T06:30:00Z"
        # The job's preview uses the job's policy, with the note on the affected entry.
        times = api.get(f"/api/v1/jobs/{job['id']}/preview?count=2").json()["fire_times"]
        assert [t["utc"] for t in times] == ["2026-11-01T06:30:00Z", "2026-11-02T06:30:00Z"]
        assert "policy 'last': fired at the second, 06:30Z" in times[0]["note"]

        default = api.post(
            "/api/v1/jobs/", {"name": "d", "cron": "0 * * * *", "timezone": NY, "target": HOOK}, format="json"
        ).json()
        assert default["dst_policy"] == {"repeated": None, "missing": None}
        assert default["dst_policy_effective"] == {"repeated": "both", "missing": "skip"}

        patched = api.patch(
            f"/api/v1/jobs/{job['id']}/", {"dst_policy": {"repeated": "both"}}, format="json"
        ).json()
        assert patched["next_run_at"] == "2026-11-01T05:30:00Z"
    assert Job.objects.get(pk=job["id"]).dst_policy == {"repeated": "both"}


def test_unsaved_preview_takes_dst_repeated_and_dst_missing(api) -> None:
    def utcs(**params):
        response = api.get(PREVIEW, {"timezone": NY, "count": 2, **params})
        assert response.status_code == 200, response.content
        return [t["utc"] for t in response.json()["fire_times"]], response.json()["fire_times"]

    got, times = utcs(cron="30 1 * * *", after="2026-10-31T12:00:00Z", dst_repeated="both")
    assert got == ["2026-11-01T05:30:00Z", "2026-11-01T06:30:00Z"]
    assert "policy 'both'" in times[0]["note"] and "policy 'both'" in times[1]["note"]
    got, times = utcs(cron="30 2 * * *", after="2026-03-07T12:00:00Z", dst_missing="skip")
    assert got == ["2026-03-09T06:30:00Z", "2026-03-10T06:30:00Z"]
    assert "policy 'skip'" in times[0]["note"]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"dst_repeated": "second"}, "dst_repeated"),
        ({"dst_missing": "later"}, "dst_missing"),
        ({"dst_missing": "SKIP"}, "dst_missing"),
    ],
)
def test_unsaved_preview_refuses_bad_policy_values(api, params, field) -> None:
    response = api.get(PREVIEW, {"cron": "30 1 * * *", "timezone": NY, **params})
    assert response.status_code == 400, response.content
    assert field in response.json()


BAD_POLICIES = [
    ("not-an-object", "last"),
    ("list", ["first"]),
    ("bad-repeated", {"repeated": "second"}),
    ("bad-missing", {"missing": "later"}),
    ("wrong-type", {"repeated": 1}),
    ("unknown-key", {"repeated": "first", "gap": "skip"}),
]


@pytest.mark.parametrize(("case", "policy"), BAD_POLICIES, ids=[c for c, _ in BAD_POLICIES])
def test_api_refuses_a_bad_policy_naming_the_field(api, case, policy) -> None:
    body = {"name": "p", "cron": "30 1 * * *", "timezone": NY, "target": HOOK, "dst_policy": policy}
    response = api.post("/api/v1/jobs/", body, format="json")
    assert response.status_code == 400, response.content
    assert list(response.json()) == ["dst_policy"], response.json()
    assert Job.objects.count() == 0
    if case == "bad-repeated":
        assert response.json()["dst_policy"][0].startswith("repeated:")


def test_api_patch_with_a_bad_policy_writes_nothing(api) -> None:
    job = api.post(
        "/api/v1/jobs/", {"name": "p", "cron": "30 1 * * *", "timezone": NY, "target": HOOK}, format="json"
    ).json()
    response = api.patch(f"/api/v1/jobs/{job['id']}/", {"dst_policy": {"missing": "never"}}, format="json")
    assert response.status_code == 400 and "dst_policy" in response.json()
    assert Job.objects.get(pk=job["id"]).dst_policy == {}


def test_openapi_documents_the_policy(api) -> None:
    schema = api.get("/api/schema/?format=json").json()
    job = schema["components"]["schemas"]["Job"]["properties"]
    assert job["dst_policy"]["properties"]["repeated"]["enum"] == ["first", "last", "both"]
    assert job["dst_policy"]["properties"]["missing"]["enum"] == ["shift", "skip"]
    assert "dst_policy_effective" in job
    params = {p["name"] for p in schema["paths"]["/api/v1/schedules/preview/"]["get"]["parameters"]}
    assert {"dst_repeated", "dst_missing"} <= params


# --------------------------------------------------------------------------
# Admin form
# --------------------------------------------------------------------------


@pytest.fixture
def fast_password_hashing(settings):
    settings.PASSWORD_HASHERS = ["django.contrib.auth.hashers.MD5PasswordHasher"]


def _form(tenant, **overrides) -> dict:
    fields = {"target": HOOK, "cron_expr": "30 1 * * *", "time_zone": NY, **overrides}
    return job_form_data(tenant, **fields)


@pytest.mark.parametrize(
    "menus",
    [{"dst_policy_repeated": "second"}, {"dst_policy_missing": "3"}, {"dst_policy_repeated": '{"x": 1}'}],
)
def test_admin_form_refuses_a_bad_policy_on_the_field(admin_client, fast_password_hashing, tenant, menus):
    response = admin_client.post("/admin/jobs/job/add/", _form(tenant, **menus))
    assert response.status_code == 200
    errors = response.context["adminform"].form.errors
    assert list(errors) == ["dst_policy"], errors
    assert Job.objects.count() == 0


def test_admin_form_shows_the_policy_as_two_menus(admin_client, fast_password_hashing, tenant):
    # Not a JSON textarea: a menu per half of the rule, the stored keys selected, and an
    # unset key left on "cron's rule" (saving the page unchanged keeps the stored object).
    fields = {"name": "m", "cron_expr": "30 1 * * *", "time_zone": NY, "target": HOOK}
    job = services.create_job(tenant=tenant, fields={**fields, "dst_policy": {"missing": "skip"}})
    response = admin_client.get(f"/admin/jobs/job/{job.pk}/edit/")
    page = response.content.decode()
    assert 'textarea name="dst_policy"' not in page
    assert '<option value="skip" selected>' in page
    repeated = page[page.index('name="dst_policy_repeated"') :]
    assert '<option value="" selected>' in repeated[: repeated.index("</select>")]
    field = admin_client.get(f"/admin/jobs/job/{job.pk}/edit/").context["adminform"].form.fields["dst_policy"]
    assert field.has_changed(job.dst_policy, ["", "skip"]) is False
    assert field.has_changed(job.dst_policy, ["last", "skip"]) is True


def test_admin_form_saves_the_policy_and_previews_it(admin_client, fast_password_hashing, tenant):
    with travel("2026-10-31T12:00:00Z"):
        response = admin_client.post("/admin/jobs/job/add/", _form(tenant, dst_policy_repeated="last"))
        assert response.status_code == 302, response.context["adminform"].form.errors
        job = Job.objects.get()
        assert job.dst_policy == {"repeated": "last"}
        assert job.next_run_at == datetime(2026, 11, 1, 6, 30, tzinfo=UTC)
        live = admin_client.get(
            "/admin/jobs/job/preview/",
            {"cron_expr": "30 1 * * *", "time_zone": NY, "dst_policy_repeated": "both"},
        )
        assert live.status_code == 200
        assert [t["utc"] for t in live.json()["fire_times"][:2]] == [
            "2026-11-01T05:30:00Z",
            "2026-11-01T06:30:00Z",
        ]
        bad = admin_client.get(
            "/admin/jobs/job/preview/",
            {"cron_expr": "30 1 * * *", "time_zone": NY, "dst_policy_repeated": "x"},
        )
        assert bad.status_code == 400 and "dst_policy" in bad.json()["error"]
