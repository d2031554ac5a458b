"""Preview endpoints: /schedules/preview (unsaved schedules) and /jobs/{id}/preview."""

from __future__ import annotations

from urllib.parse import urlencode

import pytest
from rest_framework.test import APIClient

from tests.support.clock import travel

PREVIEW = "/api/v1/schedules/preview"


def preview(api, **params):
    return api.get(f"{PREVIEW}?{urlencode(params)}")


def utcs(response) -> list[str]:
    assert response.status_code == 200, response.content
    return [t["utc"] for t in response.json()["fire_times"]]


def test_spring_forward_gap_is_noted(api):
    response = preview(
        api, cron="30 2 * * *", timezone="America/New_York", after="2026-03-06T12:00:00Z", count=3
    )
    assert utcs(response) == ["2026-03-07T07:30:00Z", "2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]
    times = response.json()["fire_times"]
    assert times[0] == {"utc": "2026-03-07T07:30:00Z", "local": "2026-03-07T02:30:00-05:00", "note": None}
    assert times[1]["local"] == "2026-03-08T03:00:00-04:00"
    assert "gap" in times[1]["note"].lower() and "02:30" in times[1]["note"]
    assert times[2]["note"] is None
    assert "02:30" in response.json()["description"]
    assert response.json()["timezone"] == "America/New_York"


def test_fall_back_overlap_fixed_time_fires_once(api):
    response = preview(
        api, cron="30 1 * * *", timezone="America/New_York", after="2026-10-31T12:00:00Z", count=2
    )
    assert utcs(response) == ["2026-11-01T05:30:00Z", "2026-11-02T06:30:00Z"]
    assert "overlap" in response.json()["fire_times"][0]["note"].lower()


def test_fall_back_overlap_elapsed_time_fires_twice(api):
    response = preview(
        api, cron="0 * * * *", timezone="America/New_York", after="2026-11-01T04:30:00Z", count=3
    )
    assert utcs(response) == ["2026-11-01T05:00:00Z", "2026-11-01T06:00:00Z", "2026-11-01T07:00:00Z"]
    first, second, third = response.json()["fire_times"]
    assert first["local"] == "2026-11-01T01:00:00-04:00" and second["local"] == "2026-11-01T01:00:00-05:00"
    assert "first" in first["note"] and "second" in second["note"] and third["note"] is None


def test_interval_is_anchored_at_after(api):
    response = preview(api, interval_seconds=900, after="2026-01-01T01:00:00+01:00", count=3)
    assert utcs(response) == ["2026-01-01T00:15:00Z", "2026-01-01T00:30:00Z", "2026-01-01T00:45:00Z"]
    assert response.json()["description"] == "Every 15 minutes"


def test_defaults_count_ten_and_after_now(api):
    with travel("2026-04-01T10:07:00Z"):
        response = preview(api, cron="*/15 * * * *")
    times = utcs(response)
    assert len(times) == 10
    assert times[0] == "2026-04-01T10:15:00Z" and times[-1] == "2026-04-01T12:30:00Z"
    assert response.json()["timezone"] == "UTC"


def test_aliases_and_names(api):
    assert utcs(preview(api, cron="@weekly", after="2026-01-01T00:00:00Z", count=1)) == [
        "2026-01-04T00:00:00Z"
    ]
    assert utcs(preview(api, cron="0 12 * JAN MON", after="2026-01-01T00:00:00Z", count=1)) == [
        "2026-01-05T12:00:00Z"
    ]


@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"cron": "61 * * * *"}, "cron"),
        ({"cron": "0 0 30 2 *"}, "cron"),
        ({"cron": "* *"}, "cron"),
        ({"cron": "* * * * *", "timezone": "Mars/Base"}, "timezone"),
        ({"cron": "30 2 * * *", "timezone": "right/America/New_York"}, "timezone"),
        ({"cron": "30 2 * * *", "timezone": "posix/America/New_York"}, "timezone"),
        ({"interval_seconds": 60, "timezone": "../../etc/localtime"}, "timezone"),
        ({"cron": "30 2 * * *", "timezone": "localtime"}, "timezone"),
        ({"cron": "30 2 * * *", "timezone": "america/new_york"}, "timezone"),
        ({}, "schedule"),
        ({"cron": "* * * * *", "interval_seconds": 60}, "schedule"),
        ({"interval_seconds": 0}, "interval_seconds"),
        ({"interval_seconds": "abc"}, "interval_seconds"),
        ({"cron": "* * * * *", "after": "yesterday"}, "after"),
        ({"cron": "* * * * *", "after": "2026-01-01T00:00:00"}, "after"),
        ({"cron": "* * * * *", "count": 0}, "count"),
        ({"cron": "* * * * *", "count": 101}, "count"),
        ({"cron": "* * * * *", "count": "many"}, "count"),
    ],
)
def test_bad_preview_params_are_field_level_400(api, params, field):
    response = preview(api, **params)
    assert response.status_code == 400, response.content
    assert field in response.json(), response.json()


def test_preview_needs_a_token(db):
    assert APIClient().get(f"{PREVIEW}?cron=*+*+*+*+*").status_code == 401


def test_zone_with_odd_transitions_does_not_hang(api):
    # Lord Howe shifts by 30 minutes; Chatham has :45 offsets.
    for zone in ("Australia/Lord_Howe", "Pacific/Chatham", "America/Santiago"):
        assert len(utcs(preview(api, cron="*/30 * * * *", timezone=zone, count=100))) == 100


def create(api, **fields) -> dict:
    response = api.post(
        "/api/v1/jobs/",
        {"name": "p", "target": {"type": "http", "url": "https://example.com/"}, **fields},
        format="json",
    )
    assert response.status_code == 201, response.content
    return response.json()


def test_job_preview_shows_the_dst_note_and_starts_at_next_run(api):
    with travel("2026-03-07T12:00:00Z"):
        job = create(api, cron="30 2 * * *", timezone="America/New_York")
        response = api.get(f"/api/v1/jobs/{job['id']}/preview?count=2")
    assert utcs(response) == ["2026-03-08T07:00:00Z", "2026-03-09T06:30:00Z"]
    assert utcs(response)[0] == job["next_run_at"]
    assert "gap" in response.json()["fire_times"][0]["note"].lower()


def test_job_preview_of_a_hashed_cron_matches_next_run_at(api):
    job = create(api, cron="H H * * *")
    times = utcs(api.get(f"/api/v1/jobs/{job['id']}/preview"))
    assert len(times) == 10 and times[0] == job["next_run_at"]


def test_job_preview_respects_end_at_and_one_time_jobs(api):
    with travel("2026-01-01T00:00:00Z"):
        job = create(api, cron="0 * * * *", end_at="2026-01-01T03:00:00Z")
        assert utcs(api.get(f"/api/v1/jobs/{job['id']}/preview?count=50")) == [
            "2026-01-01T01:00:00Z",
            "2026-01-01T02:00:00Z",
            "2026-01-01T03:00:00Z",
        ]
        once = create(api, run_at="2026-02-01T00:00:00Z")
        assert utcs(api.get(f"/api/v1/jobs/{once['id']}/preview/")) == ["2026-02-01T00:00:00Z"]


@pytest.mark.parametrize("count", ["0", "101", "ten"])
def test_job_preview_bad_count_is_400(api, count):
    job = create(api, cron="@daily")
    response = api.get(f"/api/v1/jobs/{job['id']}/preview?count={count}")
    assert response.status_code == 400 and "count" in response.json()
