"""runs/execution/retry.py: pure classification and timing, no database."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta
from email.utils import format_datetime

import pytest

from runs.execution import retry
from runs.execution.retry import PERMANENT, RETRY, SUCCESS, CallResult

NOW = datetime(2026, 3, 8, 7, 0, tzinfo=UTC)


@pytest.mark.parametrize(
    ("code", "kind"),
    [
        (200, SUCCESS),
        (201, SUCCESS),
        (204, SUCCESS),
        (299, SUCCESS),
        (408, RETRY),
        (425, RETRY),
        (429, RETRY),
        (500, RETRY),
        (502, RETRY),
        (503, RETRY),
        (504, RETRY),
        (599, RETRY),
        (400, PERMANENT),
        (401, PERMANENT),
        (403, PERMANENT),
        (404, PERMANENT),
        (409, PERMANENT),
        (410, PERMANENT),
        (422, PERMANENT),
        (301, PERMANENT),
        (302, PERMANENT),
        (100, PERMANENT),
    ],
)
def test_classification_table(code, kind):
    assert retry.classify_status(code) == kind


@pytest.mark.parametrize(
    ("header", "seconds"),
    [
        ("120", 120.0),
        (" 7 ", 7.0),
        ("0", 0.0),
        (format_datetime(NOW + timedelta(seconds=90), usegmt=True), 90.0),
        ("Sun, 08 Mar 2026 07:00:30 GMT", 30.0),
        (format_datetime(NOW - timedelta(hours=1), usegmt=True), 0.0),  # in the past: now
        ("soon", None),
        ("-5", None),
        ("1.5", None),
        ("", None),
        (None, None),
    ],
)
def test_retry_after_parsing(header, seconds):
    assert retry.parse_retry_after(header, NOW) == seconds


def test_full_jitter_bounds_grow_then_cap():
    assert [retry.backoff_bound(n, 10, 3600) for n in (1, 2, 3, 8, 9, 100, 10**6)] == [
        20,
        40,
        80,
        2560,
        3600,
        3600,
        3600,
    ]
    rng = random.Random(7)
    for attempt in range(1, 12):
        bound = min(300, 1 * 2**attempt)
        delays = [retry.retry_delay(attempt, 1, 300, rng=rng) for _ in range(500)]
        assert all(0 <= d <= bound for d in delays)
        # Full jitter spreads over the whole range, not just near the top.
        assert min(delays) < bound * 0.1 and max(delays) > bound * 0.9


def test_retry_after_wins_up_to_the_cap():
    assert retry.retry_delay(1, 10, 3600, retry_after=42) == 42
    assert retry.retry_delay(1, 10, 60, retry_after=7200) == 60
    assert retry.retry_delay(1, 10, 60, retry_after=0) == 0


def test_decide_success_retry_dead():
    def decide(result, attempt, max_attempts=5):
        return retry.decide(
            result, attempt=attempt, max_attempts=max_attempts, base=1, cap=4, rng=random.Random(1)
        )

    ok = decide(CallResult(SUCCESS, 200), 1)
    assert (ok.status, ok.outcome, ok.retry_in_s) == ("succeeded", "succeeded", None)
    again = decide(CallResult(RETRY, 503), 2)
    assert again.status == "retrying" and 0 <= again.retry_in_s <= 4
    assert decide(CallResult(RETRY, 503), 5).status == "dead"  # out of attempts
    assert decide(CallResult(RETRY, 503), 9).status == "dead"  # replayed past the limit
    assert decide(CallResult(PERMANENT, 400), 1).status == "dead"
    honoured = decide(CallResult(RETRY, 429, retry_after=3), 1)
    assert honoured.retry_in_s == 3
    assert decide(CallResult(RETRY, 429, retry_after=30), 1).retry_in_s == 4  # capped


def test_truncate_keeps_errors_under_2kb():
    assert retry.truncate("short") == "short"
    long = retry.truncate("x" * 10_000)
    assert len(long) == 2048 and long.endswith("…")
