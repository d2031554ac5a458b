"""Schemathesis against the published schema (/api/schema/) on a real server, with a
tenant token: no response >= 500, and every 4xx body says what was wrong (JSON naming
a field or carrying `detail`), whatever the generated input.

Bounded: FUZZ_EXAMPLES examples per operation (a few thousand requests in all), no
shrinking, so it stays within a minute or two on a loaded 2-core machine.
"""

from __future__ import annotations

import json
import os
from collections import Counter

import pytest
import schemathesis
from hypothesis import HealthCheck, Phase, given, settings

EXAMPLES = int(os.environ.get("FUZZ_EXAMPLES", "160"))


@pytest.fixture
def token(transactional_db):
    from jobs.tenant_services import create_tenant

    _tenant, token = create_tenant(slug="fuzz", max_concurrency=10)
    return token


def names_the_problem(body: object) -> bool:
    """A non-empty JSON object whose entries say something: {"field": ["why"]} or {"detail": "why"}."""
    if isinstance(body, dict):
        return bool(body) and all(bool(v) for v in body.values())
    if isinstance(body, list):  # non-field errors of a list serializer
        return bool(body) and all(bool(v) for v in body)
    return False


def test_api_never_fails_and_names_every_problem(live_server, token):
    # schemathesis' pytest plugin (from_fixture) does not run under pytest 9, so each
    # operation's strategy is driven by hypothesis directly; same generation.
    auth = {"Authorization": f"Bearer {token}"}
    schema = schemathesis.openapi.from_url(f"{live_server.url}/api/schema/?format=json", headers=auth)
    operations = [result.ok() for result in schema.get_all_operations()]
    assert len(operations) >= 5
    calls: Counter = Counter()
    problems: list[str] = []

    for operation in operations:

        @settings(
            max_examples=EXAMPLES,
            deadline=None,
            phases=[Phase.explicit, Phase.generate],
            suppress_health_check=list(HealthCheck),
            derandomize=True,
            database=None,
        )
        @given(case=operation.as_strategy())
        def call(case) -> None:
            response = case.call(base_url=live_server.url, headers=auth, timeout=30)
            calls[response.status_code // 100] += 1
            where = f"{case.method} {case.formatted_path} -> {response.status_code}: {response.text[:300]}"
            if response.status_code >= 500:
                problems.append(where)
            elif response.status_code >= 400:
                try:
                    body = json.loads(response.text)
                except ValueError:
                    body = None
                if not names_the_problem(body):
                    problems.append(where)

        call()

    print(f"fuzz: {len(operations)} operations, responses by class {dict(sorted(calls.items()))}")
    assert sum(calls.values()) >= len(operations) * 10
    assert problems == [], "\n".join(sorted(set(problems))[:30])


@pytest.mark.parametrize(
    "body, ok",
    [
        ({"target": ["Enter a public host."]}, True),
        ({"detail": "Not found."}, True),
        (["This field is required."], True),
        ({}, False),
        ({"detail": ""}, False),
        ([], False),
        (None, False),  # not JSON (an HTML error page)
    ],
)
def test_a_4xx_body_must_name_the_problem(body, ok):
    assert names_the_problem(body) is ok
