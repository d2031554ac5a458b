"""breakers.record against the real database: whatever path it takes (one statement for
answers only, the locked read-decide-write otherwise), the row it leaves is what the pure
rule, apply_outcomes, makes of the row before, at the database time of the write."""

from __future__ import annotations

import asyncio

import pytest

from runs.execution import breaker_rules as rules
from runs.execution import breakers, connections
from runs.execution.breaker_rules import DOWN, UP, HostState, Policy, apply_outcomes
from tests.conftest import database_url

pytestmark = pytest.mark.django_db(transaction=True)

# Breakers are per (tenant, host): A and A2 are two tenants' breakers for one host.
A = (1, "http://a.example:80")
A2 = (2, "http://a.example:80")
B = (1, "https://b.example:443")
COLUMNS = (
    "tenant_id, host, state, failures, failure_window_start, opened_at, open_until, cooldown_seconds,"
    " window_start, requests, retries, recovered_at"
)


async def _scenario(before: dict[tuple, dict], outcomes: list[tuple[tuple, str]]):
    """Insert the `before` rows (times as offsets in seconds from now), record, and return
    (states before, states after, the write's database time)."""
    conn = await connections.connect_async(database_url())
    try:
        for (tenant_id, host), given in before.items():
            fields = {"state": rules.CLOSED, "failures": 0, "cooldown_seconds": 0.0, "requests": 0,
                      "retries": 0, **given}  # fmt: skip
            names = ", ".join(fields)
            values = ", ".join(
                "now() + make_interval(secs => %s)" if name.endswith(("_start", "_at", "_until")) else "%s"
                for name in fields
            )
            await conn.execute(
                f"INSERT INTO target_hosts (tenant_id, host, updated_at, {names})"
                f" VALUES (%s, %s, now(), {values})",
                [tenant_id, host, *fields.values()],
            )
        read = f"SELECT {COLUMNS}, updated_at FROM target_hosts ORDER BY tenant_id, host"
        states = {(r[0], r[1]): HostState(*r[:12]) for r in await (await conn.execute(read)).fetchall()}
        await breakers.record(conn, outcomes, policy=Policy())
        rows = await (await conn.execute(read)).fetchall()
        return states, {(r[0], r[1]): HostState(*r[:12]) for r in rows}, max(r[12] for r in rows)
    finally:
        await conn.close()


def _check(before: dict[tuple, dict], outcomes: list[tuple[tuple, str]]) -> dict[tuple, HostState]:
    states, after, now = asyncio.run(_scenario(before, outcomes))
    for key, _ in outcomes:
        states.setdefault(key, HostState(*key))  # a breaker without a row starts closed and empty
    assert after == apply_outcomes(states, outcomes, now=now, policy=Policy())
    return after


def test_answers_for_a_host_without_a_row_start_its_budget_window():
    after = _check({}, [(A, UP), (B, UP), (A, UP)])
    assert (after[A].requests, after[B].requests) == (2, 1)
    assert after[A].state == rules.CLOSED and after[A].window_start is not None


def test_answers_inside_the_window_add_to_its_counts():
    before = {A: {"window_start": -20, "requests": 7, "retries": 2, "cooldown_seconds": 10.0}}
    after = _check(before, [(A, UP)] * 3)
    assert (after[A].requests, after[A].retries) == (10, 2)


def test_answers_after_the_window_start_a_new_one():
    before = {A: {"window_start": -61, "requests": 7, "retries": 2}}
    after = _check(before, [(A, UP)] * 3)
    assert (after[A].requests, after[A].retries) == (3, 0)


def test_an_answer_closes_an_open_or_half_open_breaker():
    open_ = {
        "state": rules.OPEN, "failures": 5, "failure_window_start": -30, "opened_at": -10,
        "open_until": -1, "cooldown_seconds": 20.0, "window_start": -30, "requests": 9, "retries": 4,
    }  # fmt: skip
    before = {A: open_, B: {**open_, "state": rules.HALF_OPEN}}
    after = _check(before, [(A, UP), (B, UP)])
    assert after[A].state == after[B].state == rules.CLOSED
    assert after[A].cooldown_seconds == 20.0  # kept: the next opening starts from the policy's
    # Recovery: the ramp starts, with a budget minute of its own that holds this answer.
    assert after[A].recovered_at == after[A].window_start and after[A].recovered_at is not None
    assert (after[A].requests, after[A].retries) == (1, 0)


def test_the_ramp_lasts_through_answers_and_ends_at_a_failure():
    ramping = {"window_start": -5, "requests": 3, "retries": 6, "recovered_at": -5}
    after = _check({A: ramping}, [(A, UP), (A, UP)])
    assert after[A].recovered_at is not None and (after[A].requests, after[A].retries) == (5, 6)
    after = _check({B: ramping}, [(B, UP), (B, DOWN)])
    assert after[B].recovered_at is None and after[B].failures == 1


def test_one_tenants_failures_open_only_its_own_breaker_of_a_host():
    after = _check({}, [(A2, DOWN)] * 5 + [(A, UP)])
    assert after[A2].state == rules.OPEN and after[A].state == rules.CLOSED
    assert (after[A].failures, after[A].requests) == (0, 1)


def test_failures_among_answers_keep_their_order():
    before = {A: {"failures": 4, "failure_window_start": -5, "window_start": -5, "requests": 4}}
    after = _check(before, [(A, UP), (A, DOWN), (B, DOWN)])
    assert after[A].failures == 1 and after[A].state == rules.CLOSED
    assert after[B].failures == 1


def test_an_answer_after_failures_clears_them():
    after = _check({}, [(A, DOWN)] * 4 + [(A, UP)])
    assert after[A].failures == 0
