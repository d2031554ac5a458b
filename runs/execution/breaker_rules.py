"""Circuit breakers and retry budgets per (tenant, target host): the rules, pure.

One breaker per tenant and scheme://host:port: a tenant's failing calls open only its
own breaker, so another tenant's runs to the same host are never deferred by them
(runs/execution/breakers.py keeps the state in `target_hosts` and applies these rules).

- `decide_admission`: which claimed HTTP runs are sent now. A run behind an open
  breaker, or a retry over its breaker's budget, is deferred (put back unsent, no
  attempt used). One probe per cool-down goes to the run with the most attempts left,
  never to a paused job's run; runs waiting behind a probe in flight look again soon
  (`SHORT_WAIT`, longer the longer the probe takes), so an answer is followed at once.
- `apply_outcomes`: failures open the breaker, an answer closes it. An answer that
  closes an open breaker starts a recovery ramp: until the next failure each answer
  allows `RAMP_RETRIES_PER_ANSWER` more retries, so the backlog deferred during the
  outage drains as fast as the host answers (doubling every round trip), not at the
  budget's floor of a minute.

Pure functions of (state, runs, now, policy), tested directly.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime, timedelta
from functools import lru_cache
from urllib.parse import urlsplit

CLOSED = "closed"
OPEN = "open"
HALF_OPEN = "half_open"

UP = "up"  # the host answered (2xx, or a 4xx: it is up, the request was wrong)
DOWN = "down"  # connect error, timeout, 5xx, 429, 408, 425

BUDGET_WINDOW = timedelta(minutes=1)
# How soon a run held back by a probe in flight or by the recovery ramp looks again:
# both wait for answers that usually come within a round trip.
SHORT_WAIT = timedelta(seconds=1)
RAMP_RETRIES_PER_ANSWER = 2
_DEFAULT_PORTS = {"http": 80, "https": 443}

# A breaker's key: (tenant id, scheme://host:port).
BreakerKey = tuple[int, str]


@dataclass(frozen=True)
class Policy:
    failures: int = 5  # consecutive failures within `window_seconds` open the breaker
    window_seconds: float = 30.0
    cooldown_seconds: float = 5.0  # first wait before a probe, doubling ...
    max_cooldown_seconds: float = 60.0  # ... up to this
    max_defer_seconds: float = 3600.0  # a run deferred longer goes back to normal retries
    retry_budget_ratio: float = 0.2  # retries at most this share of a breaker's requests a minute
    retry_budget_floor: int = 10  # retries a minute always allowed

    @classmethod
    def from_settings(cls) -> Policy:
        from django.conf import settings

        return cls(
            failures=settings.EXECUTOR_CIRCUIT_FAILURES,
            window_seconds=settings.EXECUTOR_CIRCUIT_WINDOW_SECONDS,
            cooldown_seconds=settings.EXECUTOR_CIRCUIT_COOLDOWN_SECONDS,
            max_cooldown_seconds=settings.EXECUTOR_CIRCUIT_MAX_COOLDOWN_SECONDS,
            max_defer_seconds=settings.EXECUTOR_CIRCUIT_MAX_DEFER_SECONDS,
            retry_budget_ratio=settings.EXECUTOR_RETRY_BUDGET_RATIO,
            retry_budget_floor=settings.EXECUTOR_RETRY_BUDGET_FLOOR,
        )


@dataclass(frozen=True)
class HostState:
    """One row of `target_hosts`: the breaker and retry budget of a tenant's host."""

    tenant_id: int
    host: str
    state: str = CLOSED
    failures: int = 0
    failure_window_start: datetime | None = None
    opened_at: datetime | None = None
    open_until: datetime | None = None
    cooldown_seconds: float = 0.0
    window_start: datetime | None = None
    requests: int = 0
    retries: int = 0
    recovered_at: datetime | None = None  # an answer closed the open breaker: ramping up

    @property
    def key(self) -> BreakerKey:
        return (self.tenant_id, self.host)


@dataclass(frozen=True)
class Candidate:
    """A claimed HTTP run asking to be sent."""

    key: tuple  # (job_id, scheduled_at, attempt)
    tenant_id: int
    host: str
    is_retry: bool  # its target failed an attempt before (runs/execution/inflight.is_retry)
    deferred_since: datetime | None
    attempts_left: int = 1  # after this one; a probe goes to the run that can best afford to fail
    partition_id: int = field(kw_only=True)  # where a deferral writes (one partition per statement)
    # False for a paused job's run (or one not known to be unpaused): it never probes.
    can_probe: bool = field(default=True, kw_only=True)

    @property
    def breaker(self) -> BreakerKey:
        return (self.tenant_id, self.host)


@dataclass(frozen=True)
class Deferral:
    key: tuple
    until: datetime
    reason: str


@dataclass
class Admission:
    send: list[tuple] = field(default_factory=list)
    defer: list[Deferral] = field(default_factory=list)


# Cached: each HTTP run's host is needed twice (admission, then the call's outcome), and
# a job's URL is the same at every run; urlsplit was 1-2% of the executor's CPU.
@lru_cache(maxsize=4096)
def host_key(url: str) -> str | None:
    """scheme://host:port of a URL (with the tenant, the breaker's key); None if it has no host."""
    try:
        parts = urlsplit(url)
        port = parts.port or _DEFAULT_PORTS.get(parts.scheme.lower())
    except ValueError:
        return None
    if not parts.hostname or not port:
        return None
    return f"{parts.scheme.lower()}://{parts.hostname.lower()}:{port}"


def _hms(moment: datetime | None) -> str:
    return moment.strftime("%H:%M:%S") if moment else "?"


def _fresh_window(h: HostState, now: datetime) -> HostState:
    if h.window_start is None or now - h.window_start >= BUDGET_WINDOW:
        return replace(h, window_start=now, requests=0, retries=0)
    return h


def _held_until(h: HostState, now: datetime) -> datetime:
    """Until when a run that is not this breaker's probe waits."""
    if h.open_until is None or h.open_until <= now:
        # A probe is due but this batch had no run that may probe (a paused job's).
        return now + max(SHORT_WAIT, timedelta(seconds=h.cooldown_seconds))
    if h.state == HALF_OPEN:
        # A probe is in flight: look again soon, later the longer it has been out (a host
        # that hangs until the timeout is asked a few times, not every second).
        in_flight = now - (h.open_until - timedelta(seconds=h.cooldown_seconds))
        return min(h.open_until, now + max(SHORT_WAIT, in_flight))
    return h.open_until


def decide_admission(
    states: dict[BreakerKey, HostState], candidates: Sequence[Candidate], *, now: datetime, policy: Policy
) -> tuple[Admission, dict[BreakerKey, HostState]]:
    """Which candidates go out now; the breaker states after counting them."""
    admission = Admission()
    states = dict(states)
    probes: dict[BreakerKey, Candidate] = {}
    for c in candidates:
        best = probes.get(c.breaker)
        if c.can_probe and (best is None or c.attempts_left > best.attempts_left):
            probes[c.breaker] = c
    for c in candidates:
        h = _fresh_window(states[c.breaker], now)
        overdue = (
            c.deferred_since is not None
            and (now - c.deferred_since).total_seconds() > policy.max_defer_seconds
        )
        if h.state != CLOSED and not overdue:
            if h.open_until is not None and h.open_until <= now and probes.get(c.breaker) is c:
                # The one probe of this cool-down; until it reports, others wait (_held_until).
                h = replace(h, state=HALF_OPEN, open_until=now + timedelta(seconds=h.cooldown_seconds))
            else:
                states[c.breaker] = h
                admission.defer.append(
                    Deferral(
                        c.key,
                        _held_until(h, now),
                        f"deferred: {c.host} circuit open since {_hms(h.opened_at)}",
                    )
                )
                continue
        elif c.is_retry and not overdue:
            if h.recovered_at is not None:
                allowed = policy.retry_budget_floor + RAMP_RETRIES_PER_ANSWER * h.requests
                until = now + SHORT_WAIT
            else:
                allowed = max(policy.retry_budget_floor, policy.retry_budget_ratio * h.requests)
                until = h.window_start + BUDGET_WINDOW
            if h.retries >= allowed:
                states[c.breaker] = h
                admission.defer.append(
                    Deferral(
                        c.key,
                        until,
                        f"deferred: retry budget of {c.host} spent ({h.retries} retries of"
                        f" {h.requests} requests this minute)",
                    )
                )
                continue
        # Requests are counted as they answer (apply_outcomes); retries as they are let
        # through, so one batch cannot overspend the budget.
        states[c.breaker] = replace(h, retries=h.retries + int(c.is_retry))
        admission.send.append(c.key)
    return admission, states


def apply_outcomes(
    states: dict[BreakerKey, HostState],
    outcomes: Sequence[tuple[BreakerKey, str]],
    *,
    now: datetime,
    policy: Policy,
) -> dict[BreakerKey, HostState]:
    """Breaker states after these (breaker key, UP|DOWN) outcomes, in order."""
    states = dict(states)
    for key, outcome in outcomes:
        h = states[key]
        if outcome == UP and h.state != CLOSED:
            # Recovery: the budget's minute restarts with this answer and the ramp begins.
            h = replace(h, window_start=now, requests=0, retries=0, recovered_at=now)
        h = _fresh_window(h, now)
        h = replace(h, requests=h.requests + 1)
        if outcome == UP:
            h = replace(
                h, state=CLOSED, failures=0, failure_window_start=None, opened_at=None, open_until=None
            )
            states[key] = h
            continue
        h = replace(h, recovered_at=None)  # a failure ends the ramp: the budget holds again
        if h.state == HALF_OPEN:
            cooldown = min(max(h.cooldown_seconds, policy.cooldown_seconds) * 2, policy.max_cooldown_seconds)
            h = replace(
                h, state=OPEN, cooldown_seconds=cooldown, open_until=now + timedelta(seconds=cooldown)
            )
        elif h.state == CLOSED:
            fresh = h.failure_window_start is None or (
                (now - h.failure_window_start).total_seconds() > policy.window_seconds
            )
            failures = 1 if fresh else h.failures + 1
            h = replace(h, failures=failures, failure_window_start=now if fresh else h.failure_window_start)
            if failures >= policy.failures:
                h = replace(
                    h,
                    state=OPEN,
                    opened_at=now,
                    cooldown_seconds=policy.cooldown_seconds,
                    open_until=now + timedelta(seconds=policy.cooldown_seconds),
                )
        # OPEN: a failure of a call sent before it opened says nothing new.
        states[key] = h
    return states
