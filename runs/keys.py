"""The run key `<job_id>/<scheduled_at RFC 3339 Z>`: idempotency key and URL path segment."""

from datetime import UTC, datetime
from functools import lru_cache
from uuid import UUID


# Cached: an executor formats each run's slot for its key and headers, and the runs of
# one batch mostly share a slot (the top of the hour); a fifth of the cost of building
# an HTTP run's headers in py-spy. Equal instants in other zones format alike.
@lru_cache(maxsize=1024)
def format_utc(moment: datetime) -> str:
    """RFC 3339 in UTC with a Z, microseconds only when present (manual triggers have them)."""
    moment = moment.astimezone(UTC)
    text = moment.isoformat(timespec="microseconds" if moment.microsecond else "seconds")
    return text.replace("+00:00", "Z")


class NaiveTimestamp(ValueError):
    """A timestamp without an offset: which instant it means is unknown."""


def parse_rfc3339(text: str) -> datetime:
    """An aware datetime in the offset given (any RFC 3339 offset, `z` or `Z`).

    Raises NaiveTimestamp without an offset, ValueError when it is no timestamp.
    """
    value = datetime.fromisoformat(text.strip().replace("z", "Z").replace("Z", "+00:00"))
    if value.tzinfo is None:
        raise NaiveTimestamp("timestamp needs a zone, e.g. 2026-03-08T07:00:00Z")
    return value


def parse_utc(text: str) -> datetime:
    """Inverse of format_utc; accepts any RFC 3339 offset. Raises ValueError."""
    return parse_rfc3339(text).astimezone(UTC)


def run_key(job_id: UUID | str, scheduled_at: datetime) -> str:
    return f"{job_id}/{format_utc(scheduled_at)}"
