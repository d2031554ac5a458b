"""When an executor moves the successes it wrote in place (Citus), and which: the waiting
keys of runs/execution/history_moves.Pending, in memory. The move itself runs against the
database in tests/test_run_history.py."""

from __future__ import annotations

import uuid
from datetime import UTC, datetime, timedelta

from runs.execution import history_moves
from runs.execution.history_moves import MOVE_AFTER_SECONDS, MOVE_BATCH, RETRY_SECONDS, Pending

SLOT = datetime(2026, 12, 7, tzinfo=UTC)


def keys(n: int, *, partition: int = 0) -> list:
    return [(partition, uuid.uuid4(), SLOT + timedelta(minutes=i)) for i in range(n)]


def test_a_key_is_moved_once_it_has_waited(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(history_moves.time, "monotonic", lambda: clock[0])
    pending = Pending()
    assert not pending.due()
    pending.note(keys(3))
    assert not pending.due()
    clock[0] += MOVE_AFTER_SECONDS
    assert pending.due()
    assert len(pending.take()) == 3 and len(pending) == 0 and not pending.due()


def test_a_full_batch_is_moved_at_once_and_the_oldest_go_first(monkeypatch):
    monkeypatch.setattr(history_moves.time, "monotonic", lambda: 100.0)
    pending = Pending()
    first = keys(MOVE_BATCH)
    pending.note(first)
    pending.note(keys(5, partition=1))
    assert pending.due()
    assert pending.take() == first
    assert len(pending) == 5


def test_keys_whose_move_failed_wait_behind_the_others_and_moves_pause(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(history_moves.time, "monotonic", lambda: clock[0])
    pending = Pending()
    failed = keys(2, partition=7)
    pending.note(keys(3))
    pending.put_back(failed)
    clock[0] += MOVE_AFTER_SECONDS
    assert not pending.due()  # within RETRY_SECONDS of the failure
    clock[0] += RETRY_SECONDS
    assert pending.due()
    assert pending.take()[-2:] == failed


def test_past_the_cap_the_oldest_keys_are_given_up(monkeypatch, caplog):
    monkeypatch.setattr(history_moves, "MAX_PENDING", 10)
    monkeypatch.setattr(history_moves, "MOVE_BATCH", 4)
    pending = Pending()
    noted = keys(11)
    pending.note(noted)
    # Down to a move's worth below the cap, at once: not one key per success noted.
    assert len(pending) == 6
    assert pending.take() == noted[5:9]
    assert "gave up moving 5 success(es)" in caplog.text


def test_a_move_that_failed_nothing_does_not_pause_the_next(monkeypatch):
    clock = [100.0]
    monkeypatch.setattr(history_moves.time, "monotonic", lambda: clock[0])
    pending = Pending()
    pending.note(keys(1))
    pending.put_back([])
    clock[0] += MOVE_AFTER_SECONDS
    assert len(pending) == 1 and pending.due()
