"""Moving "now" in tests.

Services decide which slots are past on the database's clock (`scheduler_project.db.now`),
which time_machine cannot move. `travel()` moves the Python clock and points that one
seam at it, so a test can still say "it is 2026-03-07T12:00Z"; tests that check the
database clock is used (tests/test_clock.py) do not travel through here.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime
from unittest import mock

import time_machine

from runs.keys import parse_utc


@contextmanager
def travel(moment: str | datetime) -> Iterator[None]:
    when = parse_utc(moment) if isinstance(moment, str) else moment
    with (
        time_machine.travel(when, tick=False),
        mock.patch("scheduler_project.db.now", lambda: datetime.now(UTC)),
    ):
        yield
