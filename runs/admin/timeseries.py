"""Time series of the dashboard charts: aggregate reads with no ORM form (date_bin,
percentile_cont), bounded to a recent window so they prune to recent partitions."""

from __future__ import annotations

from datetime import datetime

from django.db import connection

_PER_MINUTE_SQL = """
SELECT date_bin('1 minute', scheduled_at, %(origin)s) AS bucket, status, count(*)
FROM runs WHERE scheduled_at >= %(since)s AND scheduled_at < %(until)s
GROUP BY 1, 2
"""

# started_at is the latest attempt's start: a retried run's lateness includes its retries.
_LATENESS_SQL = """
SELECT date_bin(make_interval(secs => %(step)s), scheduled_at, %(origin)s) AS bucket,
       percentile_cont(0.5) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM started_at - scheduled_at)),
       percentile_cont(0.99) WITHIN GROUP (ORDER BY EXTRACT(EPOCH FROM started_at - scheduled_at)),
       count(*)
FROM runs
WHERE scheduled_at >= %(since)s AND scheduled_at < %(until)s AND started_at IS NOT NULL
GROUP BY 1
"""


def runs_per_minute(*, since: datetime, until: datetime) -> dict[tuple[datetime, str], int]:
    """Runs scheduled in [since, until) by (minute, status); the window prunes to recent partitions."""
    with connection.cursor() as cursor:
        cursor.execute(_PER_MINUTE_SQL, {"origin": since, "since": since, "until": until})
        return {(bucket, status): n for bucket, status, n in cursor.fetchall()}


def lateness_percentiles(
    *, since: datetime, until: datetime, step_seconds: int
) -> dict[datetime, tuple[float, float, int]]:
    """(p50, p99, runs) of started_at - scheduled_at in seconds, per `step_seconds` bucket of scheduled_at."""
    with connection.cursor() as cursor:
        cursor.execute(_LATENESS_SQL, {"origin": since, "since": since, "until": until, "step": step_seconds})
        return {bucket: (float(p50), float(p99), n) for bucket, p50, p99, n in cursor.fetchall()}
