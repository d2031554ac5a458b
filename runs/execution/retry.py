"""Outcome classification and retry timing. Pure: no I/O, no clock of its own.

Full jitter (AWS architecture blog, "Exponential Backoff And Jitter"): after failed
attempt n the next one waits uniform(0, min(cap, base * 2**n)), which spreads a
thundering herd of retries evenly instead of re-synchronising it.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from datetime import UTC, datetime
from email.utils import parsedate_to_datetime

from runs.attempts import RETRIED, used_up

SUCCESS = "success"
RETRY = "retry"
PERMANENT = "permanent"

# Statuses that say "try again later" rather than "your request is wrong".
RETRYABLE_STATUSES = frozenset({408, 425, 429})

MAX_ERROR_CHARS = 2048


@dataclass(frozen=True)
class CallResult:
    """What one attempt at a target produced, before deciding what happens next."""

    kind: str  # SUCCESS | RETRY | PERMANENT
    result_code: int | None = None
    error: str = ""
    retry_after: float | None = None  # seconds the target asked us to wait
    missing_task: str = ""  # a task target this executor has not registered (alerted)


@dataclass(frozen=True)
class Decision:
    status: str  # succeeded | retrying | dead
    outcome: str  # the attempts-entry outcome: succeeded | retry | dead
    retry_in_s: float | None


def classify_status(code: int) -> str:
    if 200 <= code < 300:
        return SUCCESS
    if code in RETRYABLE_STATUSES or code >= 500:
        return RETRY
    # Other 4xx (and 1xx/3xx, since redirects are not followed) will not improve by retrying.
    return PERMANENT


def parse_retry_after(value: str | None, now: datetime) -> float | None:
    """Seconds to wait from a Retry-After header (delta-seconds or HTTP-date), or None."""
    if not value:
        return None
    value = value.strip()
    if value.isdigit():
        return float(value)
    try:
        moment = parsedate_to_datetime(value)
    except (TypeError, ValueError, IndexError):
        return None
    if moment is None:
        return None
    if moment.tzinfo is None:
        moment = moment.replace(tzinfo=UTC)
    return max(0.0, (moment - now).total_seconds())


def backoff_bound(attempt: int, base: float, cap: float) -> float:
    """Upper bound of the delay after failed attempt `attempt` (1-based)."""
    # 2**attempt overflows float for absurd attempt numbers; the cap wins long before.
    return min(cap, base * 2 ** min(attempt, 62))


def retry_delay(
    attempt: int, base: float, cap: float, retry_after: float | None = None, rng: random.Random | None = None
) -> float:
    if retry_after is not None:
        return min(cap, max(0.0, retry_after))
    return (rng or random).uniform(0, backoff_bound(attempt, base, cap))


def decide(
    result: CallResult,
    *,
    attempt: int,
    max_attempts: int,
    base: float,
    cap: float,
    rng: random.Random | None = None,
) -> Decision:
    if result.kind == SUCCESS:
        return Decision("succeeded", "succeeded", None)
    if result.kind == PERMANENT or used_up(used=attempt, max_attempts=max_attempts):
        return Decision("dead", "dead", None)
    return Decision("retrying", RETRIED, retry_delay(attempt, base, cap, result.retry_after, rng))


def truncate(text: str, limit: int = MAX_ERROR_CHARS) -> str:
    """Storable error text: jsonb and text columns reject NUL, and a lone surrogate
    cannot be encoded; one such byte in a response body must not fail the whole
    outcome batch of an executor."""
    text = text.replace("\x00", "\ufffd").encode("utf-8", errors="replace").decode("utf-8")
    if len(text) <= limit:
        return text
    return text[: limit - 1] + "…"
