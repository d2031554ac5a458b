"""Circuit breakers and retry budgets per (tenant, target host): the pure rules, then real
executor processes against a real local HTTP server that fails and recovers."""

from __future__ import annotations

import time
from dataclasses import replace
from datetime import UTC, datetime, timedelta

import pytest

from runs.execution import breaker_rules as rules
from runs.execution import breakers
from runs.execution.breaker_rules import Candidate, HostState, Policy, apply_outcomes, decide_admission
from runs.models import ExecutorNode, JobRun, JobRunRow, TargetHost
from tests.support.executor import http_spec, queue_runs, row, wait_for
from tests.support.http_target import Reply

T0 = datetime(2026, 1, 1, 9, 0, 0, tzinfo=UTC)
HOST = "http://example.com:80"
KEY = (1, HOST)  # tenant 1's breaker for HOST


def _at(seconds: float) -> datetime:
    return T0 + timedelta(seconds=seconds)


def _fail(state: HostState, times: int, *, at: float) -> HostState:
    states = {KEY: state}
    return apply_outcomes(states, [(KEY, rules.DOWN)] * times, now=_at(at), policy=Policy())[KEY]


def _candidate(
    n: int, *, retry: bool = False, deferred_since: datetime | None = None, left: int = 3
) -> Candidate:
    return Candidate((n,), 1, HOST, retry, deferred_since, left, partition_id=0)


def test_host_key_is_scheme_host_and_port():
    assert rules.host_key("https://Example.COM/a?b") == "https://example.com:443"
    assert rules.host_key("http://example.com:8080/x") == "http://example.com:8080"
    assert rules.host_key("not a url") is None


def test_five_failures_within_the_window_open_the_breaker():
    state = _fail(HostState(1, HOST), 4, at=0)
    assert state.state == rules.CLOSED
    state = _fail(state, 1, at=29)
    assert state.state == rules.OPEN and state.open_until == _at(34) and state.opened_at == _at(29)
    # Spread wider than the window, failures start counting afresh.
    spread = _fail(_fail(HostState(1, HOST), 4, at=0), 1, at=31)
    assert spread.state == rules.CLOSED and spread.failures == 1


def test_open_breaker_lets_one_probe_per_cooldown_and_doubles_it_on_failure():
    state = _fail(HostState(1, HOST), 5, at=0)  # open until 5
    admission, states = decide_admission(
        {KEY: state}, [_candidate(1), _candidate(2)], now=_at(1), policy=Policy()
    )
    assert admission.send == [] and [d.until for d in admission.defer] == [_at(5), _at(5)]
    assert "circuit open since 09:00:00" in admission.defer[0].reason
    admission, states = decide_admission(states, [_candidate(1), _candidate(2)], now=_at(5), policy=Policy())
    assert admission.send == [(1,)] and states[KEY].state == rules.HALF_OPEN
    # While the probe is out, the others look again soon, later the longer it takes
    # (at most until the next probe is due): its answer is followed within a second or so.
    assert [d.until for d in admission.defer] == [_at(6)]
    waits = [decide_admission(states, [_candidate(2)], now=_at(t), policy=Policy())[0] for t in (6, 8, 9)]
    assert [a.defer[0].until for a in waits] == [_at(7), _at(10), _at(10)]
    failed = apply_outcomes(states, [(KEY, rules.DOWN)], now=_at(6), policy=Policy())[KEY]
    assert failed.state == rules.OPEN and failed.cooldown_seconds == 10 and failed.open_until == _at(16)
    capped = HostState(1, HOST, state=rules.HALF_OPEN, cooldown_seconds=40)
    assert _fail(capped, 1, at=0).cooldown_seconds == 60
    closed = apply_outcomes({KEY: failed}, [(KEY, rules.UP)], now=_at(17), policy=Policy())[KEY]
    assert closed.state == rules.CLOSED and closed.failures == 0


def test_the_probe_is_the_run_with_the_most_attempts_left():
    state = _fail(HostState(1, HOST), 5, at=0)
    candidates = [_candidate(1, retry=True, left=1), _candidate(2, left=3), _candidate(3, retry=True, left=2)]
    admission, _ = decide_admission({KEY: state}, candidates, now=_at(5), policy=Policy())
    assert admission.send == [(2,)]


def test_a_run_deferred_past_the_limit_goes_back_to_normal_retries():
    state = _fail(HostState(1, HOST), 5, at=0)
    policy = Policy(max_defer_seconds=60)
    fresh = _candidate(1, deferred_since=_at(0))
    overdue = _candidate(2, deferred_since=_at(-61))
    admission, _ = decide_admission({KEY: state}, [fresh, overdue], now=_at(1), policy=policy)
    assert admission.send == [(2,)] and [d.key for d in admission.defer] == [(1,)]


def test_retries_beyond_the_budget_are_deferred_to_the_next_window():
    policy = Policy(retry_budget_ratio=0.2, retry_budget_floor=2)
    answered = apply_outcomes({KEY: HostState(1, HOST)}, [(KEY, rules.UP)] * 20, now=_at(0), policy=policy)
    assert answered[KEY].requests == 20
    retries = [_candidate(100 + n, retry=True) for n in range(10)]
    firsts = [_candidate(n) for n in range(5)]
    admission, states = decide_admission(answered, retries + firsts, now=_at(1), policy=policy)
    # Retries at most 20% of the minute's 20 requests: 4; first attempts are not held back.
    assert len(admission.send) == 9 and states[KEY].retries == 4
    assert {d.until for d in admission.defer} == {_at(60)}
    assert "retry budget" in admission.defer[0].reason
    # A new minute, a new budget (the floor at least).
    admission, _ = decide_admission(states, retries[4:], now=_at(60), policy=policy)
    assert len(admission.send) == 2


def test_one_tenants_open_breaker_holds_back_none_of_anothers_runs_to_the_host():
    other = (2, HOST)
    states = {KEY: _fail(HostState(1, HOST), 5, at=0), other: HostState(2, HOST)}
    mine = Candidate((1,), 2, HOST, False, None, 3, partition_id=0)
    retry = Candidate((2,), 2, HOST, True, None, 3, partition_id=0)
    admission, after = decide_admission(states, [_candidate(3), mine, retry], now=_at(1), policy=Policy())
    assert admission.send == [(1,), (2,)] and [d.key for d in admission.defer] == [(3,)]
    assert after[other].state == rules.CLOSED and after[other].retries == 1


def test_a_paused_jobs_run_never_probes():
    state = _fail(HostState(1, HOST), 5, at=0)  # open until 5
    paused = replace(_candidate(1, left=9), can_probe=False)
    admission, states = decide_admission(
        {KEY: state}, [paused, _candidate(2, left=1)], now=_at(5), policy=Policy()
    )
    assert admission.send == [(2,)] and [d.key for d in admission.defer] == [(1,)]
    # Alone, it is held back a cool-down and the breaker stays open for the next probe.
    admission, states = decide_admission({KEY: state}, [paused], now=_at(7), policy=Policy())
    assert admission.send == [] and admission.defer[0].until == _at(12)
    assert states[KEY].state == rules.OPEN and states[KEY].open_until == _at(5)


def test_after_a_probe_succeeds_the_backlog_ramps_up_with_the_answers():
    policy = Policy(retry_budget_ratio=0.2, retry_budget_floor=10)
    state = _fail(HostState(1, HOST), 5, at=0)
    backlog = [_candidate(n, retry=True) for n in range(100)]
    admission, states = decide_admission({KEY: state}, backlog[:1], now=_at(5), policy=policy)
    states = apply_outcomes(states, [(KEY, rules.UP)], now=_at(5.1), policy=policy)
    assert states[KEY].state == rules.CLOSED and states[KEY].recovered_at == _at(5.1)
    sent, rounds = 1, 0
    while sent < 100:
        rounds += 1
        now = _at(5.1 + rounds)
        admission, states = decide_admission(states, backlog[sent:], now=now, policy=policy)
        # Held back only until the answers of what went out: a second, not the next minute.
        assert {d.until for d in admission.defer} <= {now + rules.SHORT_WAIT}
        states = apply_outcomes(states, [(KEY, rules.UP)] * len(admission.send), now=now, policy=policy)
        sent += len(admission.send)
    # 10 + 2 per answer: 12, 24, 48, then the rest (the budget's floor: 10 a minute).
    assert rounds == 4
    # A failure ends the ramp: the budget holds again, until the minute is over.
    states = apply_outcomes(states, [(KEY, rules.DOWN)], now=_at(9.5), policy=policy)
    assert states[KEY].recovered_at is None
    admission, _ = decide_admission(states, backlog, now=_at(10), policy=policy)
    assert admission.send == [] and {d.until for d in admission.defer} == {_at(65.1)}


# --- real executors, real HTTP ---------------------------------------------------------------


def _behind_an_outage(http_target, *, slug: str, count: int):
    """A new tenant's `count` runs (3 attempts, backoff 1-2 s) to /flaky, which answers 503
    for the next 20 s: (tenant, when the host is back, run keys)."""
    from jobs.tenant_services import create_tenant

    tenant, _ = create_tenant(slug=slug, max_concurrency=100)
    recovered_at = http_target.outage("/flaky", 20)
    keys = queue_runs(
        tenant,
        http_spec(http_target.url("/flaky")),
        count=count,
        max_attempts=3,
        retry_backoff_seconds=1,
        retry_backoff_cap_seconds=2,
    )
    return tenant, recovered_at, keys


def _executors_ready(count: int) -> None:
    """Wait until `count` executors have registered: on a loaded machine a process can take
    longer to start than the outage lasts, and an outage nobody saw tests nothing."""
    wait_for(
        lambda: ExecutorNode.objects.count() >= count, timeout=90, what=f"{count} executor(s) registered"
    )


def _ended(keys) -> int:
    return JobRun.objects.filter(job_id__in=[k[0] for k in keys], status__in=["succeeded", "dead"]).count()


@pytest.mark.processes
def test_an_outage_ends_in_success_without_hammering_the_host(processes, http_target):
    # The budget is not under test here: a high floor leaves the breaker alone.
    processes.start("run_executor", env={"EXECUTOR_RETRY_BUDGET_FLOOR": "100000"})
    _executors_ready(1)
    tenant, recovered_at, keys = _behind_an_outage(http_target, slug="breakers", count=50)
    wait_for(lambda: _ended(keys) == 50, timeout=150, what="all 50 runs to finish")
    runs = [row(k) for k in keys]
    assert sorted({r.status for r in runs}) == ["succeeded"], [(r.status, r.last_error) for r in runs]
    during = [r for r in http_target.received("/flaky") if r.at < recovered_at]
    print(f"requests during the 20 s outage: {len(during)} (3 per run would be 150)")
    assert len(during) < 100
    assert any(r.deferrals > 0 for r in runs)
    # A deferral used no attempt: none of them needed more than its 3.
    assert all(r.attempt - r.deferrals <= 3 for r in runs)
    host = TargetHost.objects.get(tenant_id=tenant.id, host=rules.host_key(http_target.url("/flaky")))
    assert host.state == rules.CLOSED


@pytest.mark.processes
def test_after_a_short_outage_the_backlog_drains_as_fast_as_the_host_answers(processes, http_target):
    """Two executors, default breaker and budget: the runs deferred during a 20 s outage
    go out as the host answers once a probe succeeds, not at the budget's floor (10 a
    minute: 40 runs took minutes), and the host is still spared during the outage."""
    processes.start("run_executor")
    processes.start("run_executor")
    _executors_ready(2)
    _, recovered_at, keys = _behind_an_outage(http_target, slug="recovery", count=40)
    wait_for(
        lambda: _ended(keys) == 40,
        timeout=recovered_at + 60 - time.time(),
        what="all 40 runs to end within 60 s of the host's recovery",
    )
    runs = [row(k) for k in keys]
    assert sorted({r.status for r in runs}) == ["succeeded"], [(r.status, r.last_error) for r in runs]
    during = [r for r in http_target.received("/flaky") if r.at < recovered_at]
    last = max(r.finished_at for r in runs).timestamp() - recovered_at
    print(
        f"requests during the outage: {len(during)} for 40 runs; last run ended {last:.1f} s after recovery"
    )
    assert len(during) < 2 * 40
    assert any(r.deferrals > 0 for r in runs)


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

    from runs.attempts import AttemptRecord
    from runs.execution import inflight
    from runs.services import replay_run
    from tests.support.executor import claim_now, on_executor_connection, reap_now, set_running

    url = "http://127.0.0.1:9/budget"
    orphan, handed_back, replayed, failed = queue_runs(tenant, http_spec(url), count=4, max_attempts=5)
    set_running(orphan, lease=timedelta(seconds=-1))
    assert [r.status for r in reap_now()] == ["retrying"]
    now = timezone.now()

    def ended(key, outcome: str, status: str, *, as_object: bool = False) -> None:
        record = AttemptRecord(1, "x:1", now, now, 5.0, outcome, 503, "HTTP 503", None)
        entry = record.to_display() if as_object else record.to_stored()
        JobRunRow.objects.filter(job_id=key[0], scheduled_at=key[1]).update(
            status=status, attempt=1, attempts=[entry], not_before=now, finished_at=now
        )

    # An object: how a row stored before entries were arrays holds it (runs/attempts.py).
    ended(handed_back, "handed back", "retrying", as_object=True)
    ended(failed, "retry", "retrying")
    ended(replayed, "dead", "dead")
    replay_run(job_id=replayed[0], scheduled_at=replayed[1], actor="test")
    # This minute's budget is spent: a retry the host asked for must wait for the next.
    TargetHost.objects.create(
        tenant_id=tenant.id,
        host="http://127.0.0.1:9",
        window_start=now,
        requests=0,
        retries=5,
        updated_at=now,
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
    """Breakers are per tenant: alpha's down.example is open, beta's is closed."""
    from django.utils import timezone

    from jobs.tenant_services import create_tenant

    alpha, _ = create_tenant(slug="alpha")
    beta, _ = create_tenant(slug="beta")
    now = timezone.now()
    TargetHost.objects.create(
        tenant_id=alpha.id,
        host="https://down.example:443",
        state="open",
        opened_at=now,
        open_until=now,
        updated_at=now,
    )
    TargetHost.objects.create(
        tenant_id=beta.id, host="https://down.example:443", state="closed", updated_at=now
    )
    TargetHost.objects.create(
        tenant_id=beta.id,
        host="https://probing.example:443",
        state="half_open",
        opened_at=now,
        updated_at=now,
    )
    TargetHost.objects.create(
        tenant_id=alpha.id, host="https://fine.example:443", state="closed", updated_at=now
    )


def test_metrics_show_open_circuits(client, circuits):
    from prometheus_client.parser import text_string_to_metric_families

    response = client.get("/metrics")
    assert response.status_code == 200
    (family,) = [
        f
        for f in text_string_to_metric_families(response.content.decode())
        if f.name == "cronyard_circuit_open"
    ]
    assert {(s.labels["tenant"], s.labels["host"]): s.value for s in family.samples} == {
        ("alpha", "https://down.example:443"): 1,
        ("beta", "https://probing.example:443"): 1,
    }


def test_dashboard_lists_open_circuits(admin_client, circuits):
    page = admin_client.get("/admin/runs/jobrun/dashboard/").content.decode()
    assert 'data-tenant="alpha" data-host="https://down.example:443"' in page
    assert 'data-tenant="beta" data-host="https://probing.example:443"' in page
    assert 'data-tenant="beta" data-host="https://down.example:443"' not in page
    assert "fine.example" not in page
