"""Circuit breakers and retry budgets per target host: the pure rules, then real
executor processes against a real local HTTP server that fails and recovers."""

from __future__ import annotations

import time
from datetime import UTC, datetime, timedelta

import pytest

from runs import breakers
from runs.breakers import Candidate, HostState, Policy, apply_outcomes, decide_admission
from runs.models import JobRun, TargetHost
from tests.support.executor import http_spec, queue_runs, row, wait_for
from tests.support.http_target import Reply

T0 = datetime(2026, 1, 1, 9, 0, 0, tzinfo=UTC)
HOST = "http://example.com:80"


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _fail(state: HostState, times: int, *, at: float) -> HostState:
    states = {HOST: state}
    return apply_outcomes(states, [(HOST, breakers.DOWN)] * times, now=_at(at), policy=Policy())[HOST]


def _candidate(
    n: int, *, retry: bool = False, deferred_since: datetime | None = None, left: int = 3
) -> Candidate:
    return Candidate((n,), HOST, retry, deferred_since, left, partition_id=0)


def test_host_key_is_scheme_host_and_port():
    assert breakers.host_key("https://Example.COM/a?b") == "https://example.com:443"
    assert breakers.host_key("http://example.com:8080/x") == "http://example.com:8080"
    assert breakers.host_key("not a url") is None


def test_five_failures_within_the_window_open_the_breaker():
    state = _fail(HostState(HOST), 4, at=0)
    assert state.state == breakers.CLOSED
    state = _fail(state, 1, at=29)
    assert state.state == breakers.OPEN and state.open_until == _at(34) and state.opened_at == _at(29)
    # Spread wider than the window, failures start counting afresh.
    spread = _fail(_fail(HostState(HOST), 4, at=0), 1, at=31)
    assert spread.state == breakers.CLOSED and spread.failures == 1


def test_open_breaker_lets_one_probe_per_cooldown_and_doubles_it_on_failure():
    state = _fail(HostState(HOST), 5, at=0)  # open until 5
    admission, states = decide_admission(
        {HOST: state}, [_candidate(1), _candidate(2)], now=_at(1), policy=Policy()
    )
    assert admission.send == [] and [d.until for d in admission.defer] == [_at(5), _at(5)]
    assert "circuit open since 09:00:00" in admission.defer[0].reason
    admission, states = decide_admission(states, [_candidate(1), _candidate(2)], now=_at(5), policy=Policy())
    assert admission.send == [(1,)] and states[HOST].state == breakers.HALF_OPEN
    assert [d.until for d in admission.defer] == [_at(10)]
    failed = apply_outcomes(states, [(HOST, breakers.DOWN)], now=_at(6), policy=Policy())[HOST]
    assert failed.state == breakers.OPEN and failed.cooldown_seconds == 10 and failed.open_until == _at(16)
    capped = HostState(HOST, state=breakers.HALF_OPEN, cooldown_seconds=40)
    assert _fail(capped, 1, at=0).cooldown_seconds == 60
    closed = apply_outcomes({HOST: failed}, [(HOST, breakers.UP)], now=_at(17), policy=Policy())[HOST]
    assert closed.state == breakers.CLOSED and closed.failures == 0


def test_the_probe_is_the_run_with_the_most_attempts_left():
    state = _fail(HostState(HOST), 5, at=0)
    candidates = [_candidate(1, retry=True, left=1), _candidate(2, left=3), _candidate(3, retry=True, left=2)]
    admission, _ = decide_admission({HOST: state}, candidates, now=_at(5), policy=Policy())
    assert admission.send == [(2,)]


def test_a_run_deferred_past_the_limit_goes_back_to_normal_retries():
    state = _fail(HostState(HOST), 5, at=0)
    policy = Policy(max_defer_seconds=60)
    fresh = _candidate(1, deferred_since=_at(0))
    overdue = _candidate(2, deferred_since=_at(-61))
    admission, _ = decide_admission({HOST: state}, [fresh, overdue], now=_at(1), policy=policy)
    assert admission.send == [(2,)] and [d.key for d in admission.defer] == [(1,)]


def test_retries_beyond_the_budget_are_deferred_to_the_next_window():
    policy = Policy(retry_budget_ratio=0.2, retry_budget_floor=2)
    answered = apply_outcomes({HOST: HostState(HOST)}, [(HOST, breakers.UP)] * 20, now=_at(0), policy=policy)
    assert answered[HOST].requests == 20
    retries = [_candidate(100 + n, retry=True) for n in range(10)]
    firsts = [_candidate(n) for n in range(5)]
    admission, states = decide_admission(answered, retries + firsts, now=_at(1), policy=policy)
    # Retries at most 20% of the minute's 20 requests: 4; first attempts are not held back.
    assert len(admission.send) == 9 and states[HOST].retries == 4
    assert {d.until for d in admission.defer} == {_at(60)}
    assert "retry budget" in admission.defer[0].reason
    # A new minute, a new budget (the floor at least).
    admission, _ = decide_admission(states, retries[4:], now=_at(60), policy=policy)
    assert len(admission.send) == 2


# --- real executors, real HTTP ---------------------------------------------------------------


@pytest.mark.processes
def test_an_outage_ends_in_success_without_hammering_the_host(processes, http_target):
    from jobs.tenant_services import create_tenant

    tenant, _ = create_tenant(slug="breakers", max_concurrency=100)
    recovered_at = http_target.outage("/flaky", 20)
    keys = queue_runs(
        tenant,
        http_spec(http_target.url("/flaky")),
        count=50,
        max_attempts=3,
        retry_backoff_seconds=1,
        retry_backoff_cap_seconds=2,
    )
    # The budget is not under test here: a high floor leaves the breaker alone.
    processes.start("run_executor", env={"EXECUTOR_RETRY_BUDGET_FLOOR": "100000"})
    wait_for(
        lambda: (
            JobRun.objects.filter(job_id__in=[k[0] for k in keys], status__in=["succeeded", "dead"]).count()
            == 50
        ),
        timeout=150,
        what="all 50 runs to finish",
    )
    runs = [row(k) for k in keys]
    assert sorted({r.status for r in runs}) == ["succeeded"], [(r.status, r.last_error) for r in runs]
    during = [r for r in http_target.received("/flaky") if r.at < recovered_at]
    print(f"requests during the 20 s outage: {len(during)} (3 per run would be 150)")
    assert len(during) < 100
    assert any(r.deferrals > 0 for r in runs)
    # A deferral used no attempt: none of them needed more than its 3.
    assert all(r.attempt - r.deferrals <= 3 for r in runs)
    host = TargetHost.objects.get(host=breakers.host_key(http_target.url("/flaky")))
    assert host.state == breakers.CLOSED


@pytest.mark.processes
def test_a_host_down_longer_than_the_defer_limit_ends_in_the_dead_letter_queue(processes, http_target):
    from jobs.tenant_services import create_tenant

    tenant, _ = create_tenant(slug="deadhost", max_concurrency=100)
    http_target.outage("/down", 3600)
    keys = queue_runs(
        tenant,
        http_spec(http_target.url("/down")),
        count=10,
        max_attempts=2,
        retry_backoff_seconds=1,
        retry_backoff_cap_seconds=1,
    )
    processes.start(
        "run_executor",
        env={
            "EXECUTOR_CIRCUIT_MAX_DEFER_SECONDS": "3",
            "EXECUTOR_CIRCUIT_COOLDOWN_SECONDS": "2",
            "EXECUTOR_RETRY_BUDGET_FLOOR": "100000",
        },
    )
    wait_for(
        lambda: all(row(k).status == "dead" for k in keys),
        timeout=90,
        what="every run of the dead host to die",
    )
    for key in keys:
        run = row(key)
        assert run.attempt - run.deferrals == 2 and run.result_code == 503


@pytest.mark.processes
def test_retries_over_the_hosts_budget_are_deferred_not_sent(processes, http_target):
    from jobs.tenant_services import create_tenant

    tenant, _ = create_tenant(slug="budget", max_concurrency=100)
    http_target.script("/sick", then=Reply(503, body=b"sick"))
    keys = queue_runs(
        tenant,
        http_spec(http_target.url("/sick")),
        count=20,
        max_attempts=3,
        retry_backoff_seconds=0,
        retry_backoff_cap_seconds=0,
    )
    # The breaker is not under test here: it would stop the retries by itself.
    processes.start(
        "run_executor",
        env={
            "EXECUTOR_CIRCUIT_FAILURES": "100000",
            "EXECUTOR_RETRY_BUDGET_RATIO": "0.2",
            "EXECUTOR_RETRY_BUDGET_FLOOR": "2",
        },
    )
    wait_for(lambda: len(http_target.received("/sick")) >= 20, timeout=30, what="the first attempts")
    wait_for(
        lambda: JobRun.objects.filter(tenant_id=tenant.id, last_error__contains="retry budget").count() >= 10,
        timeout=30,
        what="retries deferred by the budget",
    )
    time.sleep(2)  # room for anything the budget failed to hold back
    sent = len(http_target.received("/sick"))
    print(f"requests sent: {sent} (without a budget: 60)")
    # 20 answered first attempts buy 0.2 * 20 = 4 retries, 0.2 * 24 more: 5 at most.
    assert sent <= 25
    deferred = [row(k) for k in keys if row(k).deferrals > 0]
    assert deferred and all(r.status == "retrying" and r.not_before > r.started_at for r in deferred)
    assert all(r.attempt - r.deferrals <= 2 for r in deferred)


@pytest.mark.django_db(transaction=True)
def test_only_retries_after_the_host_failed_a_call_spend_its_retry_budget(tenant):
    """The budget holds back retries of calls the host failed. A run whose lease ran out
    (its executor died mid-call), one handed back at an executor's shutdown, and an
    operator's replay of a dead run go out at once: the host did nothing to ask for a
    wait, and an executor crash with dozens of calls in flight must not wait out a quiet
    host's budget of 10 a minute (it did: a chaos test's runs sat deferred for minutes)."""
    from django.utils import timezone

    from runs import inflight
    from runs.attempts import AttemptRecord
    from runs.services import replay_run
    from tests.support.executor import claim_now, on_executor_connection, reap_now, set_running

    url = "http://127.0.0.1:9/budget"
    orphan, handed_back, replayed, failed = queue_runs(tenant, http_spec(url), count=4, max_attempts=5)
    set_running(orphan, lease=timedelta(seconds=-1))
    assert [r.status for r in reap_now()] == ["retrying"]
    now = timezone.now()

    def ended(key, outcome: str, status: str) -> None:
        entry = AttemptRecord(1, "x:1", now, now, 5.0, outcome, 503, "HTTP 503", None).to_json()
        JobRun.objects.filter(job_id=key[0], scheduled_at=key[1]).update(
            status=status, attempt=1, attempts=[entry], not_before=now, finished_at=now
        )

    ended(handed_back, "handed back", "retrying")
    ended(failed, "retry", "retrying")
    ended(replayed, "dead", "dead")
    replay_run(job_id=replayed[0], scheduled_at=replayed[1], actor="test")
    # This minute's budget is spent: a retry the host asked for must wait for the next.
    TargetHost.objects.create(
        host="http://127.0.0.1:9", window_start=now, requests=0, retries=5, updated_at=now
    )

    claimed = claim_now()
    assert sorted(r.previous_outcome for r in claimed) == ["dead", "handed back", "lease expired", "retry"]
    admission = on_executor_connection(
        lambda conn: breakers.admit(
            conn, inflight.breaker_candidates(claimed), policy=Policy(retry_budget_floor=1)
        )
    )
    assert sorted(key[:2] for key in admission.send) == sorted([orphan, handed_back, replayed])
    assert [(d.key[:2], "retry budget" in d.reason) for d in admission.defer] == [(failed, True)]


# --- visible to operators ------------------------------------------------------------------


@pytest.fixture
def circuits(db):
    from django.utils import timezone

    now = timezone.now()
    TargetHost.objects.create(
        host="https://down.example:443", state="open", opened_at=now, open_until=now, updated_at=now
    )
    TargetHost.objects.create(
        host="https://probing.example:443", state="half_open", opened_at=now, updated_at=now
    )
    TargetHost.objects.create(host="https://fine.example:443", state="closed", updated_at=now)


def test_metrics_show_open_circuits(client, circuits):
    from prometheus_client.parser import text_string_to_metric_families

    response = client.get("/metrics")
    assert response.status_code == 200
    (family,) = [
        f
        for f in text_string_to_metric_families(response.content.decode())
        if f.name == "cronyard_circuit_open"
    ]
    assert {s.labels["host"]: s.value for s in family.samples} == {
        "https://down.example:443": 1,
        "https://probing.example:443": 1,
    }


def test_dashboard_lists_open_circuits(admin_client, circuits):
    page = admin_client.get("/admin/runs/jobrun/dashboard/").content.decode()
    assert 'data-host="https://down.example:443"' in page
    assert 'data-host="https://probing.example:443"' in page
    assert "fine.example" not in page
