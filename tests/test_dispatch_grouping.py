"""Dispatch cost: jobs that share a schedule share its computation, and nothing else changes.

Pure planning (no database): Job instances are built unsaved, as the scheduler's read
would hand them over.
"""

from __future__ import annotations

import uuid
from datetime import UTC, datetime

import pytest

from jobs import schedule
from jobs.dispatch.planning import next_slot
from jobs.models import Job
from jobs.schedule import cron_calendar

DUE = datetime(2026, 12, 3, 8, 0, tzinfo=UTC)


def job(cron: str, zone: str, **extra) -> Job:
    return Job(id=uuid.uuid4(), cron_expr=cron, time_zone=zone, next_run_at=DUE, target={}, **extra)


@pytest.fixture
def walks(monkeypatch) -> list[str]:
    """The calendar walks the DST-aware search starts (one per uncached slot search)."""
    started: list[str] = []
    real = cron_calendar.walls

    def counting(expanded, start):
        started.append(expanded)
        return real(expanded, start)

    monkeypatch.setattr(cron_calendar, "walls", counting)
    return started


def test_jobs_sharing_expression_and_zone_search_their_slot_once(walks):
    jobs = [job("0 9 * * *", "Europe/Berlin") for _ in range(500)]
    slots = {next_slot(j, after=DUE, anchor=DUE) for j in jobs}
    assert slots == {datetime(2026, 12, 4, 8, 0, tzinfo=UTC)}
    assert len(walks) <= 1


def test_each_zone_and_expression_is_its_own_group(walks):
    berlin, tokyo = job("0 9 * * *", "Europe/Berlin"), job("0 9 * * *", "Asia/Tokyo")
    weekdays = job("0 9 * * 1-5", "Asia/Tokyo")
    after = datetime(2026, 12, 4, 1, 0, tzinfo=UTC)  # a Friday, 10:00 in Tokyo
    assert next_slot(berlin, after=after) == datetime(2026, 12, 4, 8, 0, tzinfo=UTC)
    assert next_slot(tokyo, after=after) == datetime(2026, 12, 5, 0, 0, tzinfo=UTC)
    assert next_slot(weekdays, after=after) == datetime(2026, 12, 7, 0, 0, tzinfo=UTC)  # Monday


def test_hashed_jobs_keep_their_own_minute():
    jobs = [job("H * * * *", "America/New_York") for _ in range(200)]
    got = [next_slot(j, after=DUE, anchor=DUE) for j in jobs]
    want = [schedule.next_cron_time("H * * * *", "America/New_York", DUE, j.id) for j in jobs]
    assert got == want
    assert len(set(got)) > 30  # spread over the hour, not one shared slot


def test_grouped_slots_equal_the_schedule_function_with_dst_policies():
    # A fall-back night in New York: the policy decides the slot, so it is part of the group key.
    after = datetime(2026, 11, 1, 5, 10, tzinfo=UTC)  # 01:10 EDT, the first pass
    for policy in ({}, {"repeated": "first"}, {"repeated": "both"}, {"repeated": "last"}):
        j = job("30 1 * * *", "America/New_York", dst_policy=policy)
        assert next_slot(j, after=after) == schedule.next_cron_time(
            "30 1 * * *", "America/New_York", after, j.id, policy
        )
