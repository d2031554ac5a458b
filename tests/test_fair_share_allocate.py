"""fair_share.allocate, the Citus claim's fair share: the batch's places by
(running + k) / weight over the tenants' runs in the work map, within their caps, each
tenant's places best group first, ties to the fullest shard. Pure: no database."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from runs.execution.fair_share import Group, Limits, allocate

T0 = datetime(2026, 1, 1, 9, tzinfo=UTC)


def group(partition: int, tenant: int, runs: int, *, at: datetime = T0, priority: int = 0) -> Group:
    return Group(partition, tenant, runs, 0, at, priority)


def per_tenant(places: dict[int, dict[int, int]]) -> dict[int, int]:
    out: dict[int, int] = {}
    for quotas in places.values():
        for tenant, n in quotas.items():
            out[tenant] = out.get(tenant, 0) + n
    return out


def test_weights_share_the_batch_and_running_runs_count():
    groups = [group(1, 10, 50), group(2, 20, 50), group(3, 30, 50)]
    limits = {10: Limits(weight=2, cap=100), 20: Limits(weight=1, cap=100), 30: Limits(weight=1, cap=100)}
    assert per_tenant(allocate(groups, limits, {}, limit=40)) == {10: 20, 20: 10, 30: 10}
    # A tenant with 10 running waits until the others have as many.
    assert per_tenant(allocate(groups, limits, {20: 10}, limit=10)) == {10: 7, 30: 3}


def test_caps_bound_a_tenant_and_the_rest_goes_to_the_others():
    groups = [group(1, 10, 50), group(2, 20, 50)]
    limits = {10: Limits(weight=1, cap=5), 20: Limits(weight=1, cap=100)}
    assert per_tenant(allocate(groups, limits, {10: 3}, limit=20)) == {10: 2, 20: 18}


def test_a_tenants_places_go_to_its_best_then_oldest_runs():
    groups = [
        group(1, 10, 3, at=T0 + timedelta(minutes=5)),
        group(2, 10, 3, at=T0),
        group(3, 10, 3, at=T0 + timedelta(minutes=9), priority=9),
    ]
    places = allocate(groups, {10: Limits(1, 100)}, {}, limit=7)
    assert places == {3: {10: 3}, 2: {10: 3}, 1: {10: 1}}


def test_ties_go_to_the_fullest_shard():
    # Partitions 1 and 2 share shard 100 (4 runs), partition 3 is alone in shard 200 (3).
    groups = [group(1, 10, 2), group(2, 10, 2), group(3, 10, 3)]
    shard = {1: 100, 2: 100, 3: 200}.__getitem__
    assert allocate(groups, {10: Limits(1, 100)}, {}, limit=4, shard_of=shard) == {1: {10: 2}, 2: {10: 2}}


def test_nothing_to_give():
    assert allocate([], {}, {}, limit=10) == {}
    assert allocate([group(1, 10, 0)], {10: Limits(1, 5)}, {}, limit=10) == {}
    assert allocate([group(1, 10, 5)], {10: Limits(1, 5)}, {10: 5}, limit=10) == {}


def test_a_tenants_places_follow_its_runs_across_partitions_not_whole_groups():
    # Partition 1 holds runs at 0 s and 5 s, partition 2 one at 2 s: two places are the
    # runs at 0 s and 2 s, one in each, not both of partition 1.
    at = [T0, T0 + timedelta(seconds=5)]
    one = Group(1, 10, 2, 0, T0, 0, [0, 0], at)
    two = Group(2, 10, 1, 0, T0 + timedelta(seconds=2), 0, [0], [T0 + timedelta(seconds=2)])
    assert allocate([one, two], {10: Limits(1, 100)}, {}, limit=2) == {1: {10: 1}, 2: {10: 1}}
    assert allocate([one, two], {10: Limits(1, 100)}, {}, limit=3) == {1: {10: 2}, 2: {10: 1}}
