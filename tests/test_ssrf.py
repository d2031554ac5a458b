"""SSRF through Unicode and other spellings of private addresses.

Two layers, both with private targets NOT allowed:
- create/update: the API answers 400 naming `target` for every spelling that yarl
  (the HTTP client's URL parser) turns into a private address;
- connect time: runs inserted straight into job_runs (no validator) go through the
  real executor (in this process, one batch at a time) against a real HTTP server on
  127.0.0.1, which must never see a request.
"""

from __future__ import annotations

import inspect
import time

import aiohttp
import pytest

from jobs.tenant_services import create_tenant
from runs.execution import connections
from runs.execution.executor import Executor
from runs.execution.netguard import SWITCH, address_refusal
from runs.execution.targets import GuardedConnector
from tests.support.executor import http_spec, queue_runs, row
from tests.support.http_target import Reply

JOBS = "/api/v1/jobs/"


def bold(text: str) -> str:
    """MATHEMATICAL BOLD DIGIT forms (U+1D7CE..) of the digits in `text`."""
    return "".join(chr(0x1D7CE + int(c)) if c.isdigit() else c for c in text)


def circled(text: str) -> str:
    """CIRCLED DIGIT forms (U+2460.. for 1-9, U+24EA for 0) of the digits in `text`."""
    return "".join(("\u24ea" if c == "0" else chr(0x2460 + int(c) - 1)) if c.isdigit() else c for c in text)


def fullwidth(text: str) -> str:
    return "".join(chr(0xFF10 + int(c)) if c.isdigit() else c for c in text)


def unicode_forms(address: str) -> dict[str, str]:
    """Spellings of a dotted quad that yarl's IDNA/UTS-46 mapping turns back into it."""
    superscript = str.maketrans("0123456789", "\u2070\u00b9\u00b2\u00b3\u2074\u2075\u2076\u2077\u2078\u2079")
    return {
        "fullwidth-digits": fullwidth(address),
        "ideographic-full-stop": address.replace(".", "\u3002"),
        "fullwidth-full-stop": address.replace(".", "\uff0e"),
        "circled-digits": circled(address),
        "superscript-last-digit": address[:-1] + address[-1].translate(superscript),
        "superscript-digits": address.translate(superscript),
        "math-bold-digits": bold(address),
    }


# (case id, host as written in the URL) -- every one means a loopback/link-local address.
PRIVATE_HOSTS = [
    *((f"loopback-{k}", v) for k, v in unicode_forms("127.0.0.1").items()),
    *((f"metadata-{k}", v) for k, v in unicode_forms("169.254.169.254").items()),
    ("loopback-decimal", "2130706433"),
    ("loopback-hex-short", "0x7f.1"),
    ("loopback-octal", "017700000001"),
    ("loopback-octal-dotted", "0177.0.0.1"),
    ("loopback-short", "127.1"),
    ("loopback-trailing-dot", "127.0.0.1."),
    ("metadata-decimal", "2852039166"),
    ("ipv4-mapped", "[::ffff:127.0.0.1]"),
    ("ipv4-mapped-hex", "[::ffff:7f00:1]"),
    ("ipv4-mapped-metadata", "[::ffff:169.254.169.254]"),
    ("6to4-loopback", "[2002:7f00:1::]"),
    ("6to4-metadata", "[2002:a9fe:a9fe::]"),
    ("nat64-loopback", "[64:ff9b::7f00:1]"),
    ("nat64-metadata", "[64:ff9b::169.254.169.254]"),
    ("ipv4-compatible", "[::127.0.0.1]"),
    # IPv6 with the IPv4 part in a legacy form: judged as the address it maps to.
    ("ipv4-mapped-short", "[::ffff:127.1]"),
    ("ipv4-mapped-hex-part", "[::ffff:0x7f.1]"),
    ("ipv4-mapped-short-metadata", "[::ffff:169.254.43518]"),
    ("ipv4-compatible-short", "[::127.1]"),
    ("nat64-short", "[64:ff9b::127.1]"),
    ("ipv6-loopback", "[::1]"),
    ("unspecified", "0.0.0.0"),
    ("unspecified-short", "0"),
    ("unspecified-ipv6", "[::]"),
    ("localhost-fullwidth", "\uff4c\uff4f\uff43\uff41\uff4c\uff48\uff4f\uff53\uff54"),
]


def job_body(url: str) -> dict:
    return {
        "name": "ssrf probe",
        "cron": "30 2 * * *",
        "timezone": "UTC",
        "target": {"type": "http", "url": url},
    }


@pytest.mark.parametrize(("host"), [h for _, h in PRIVATE_HOSTS], ids=[i for i, _ in PRIVATE_HOSTS])
def test_every_spelling_of_a_private_address_is_a_400_naming_target_at_create(api, settings, host):
    settings.SCHEDULER_ALLOW_PRIVATE_TARGETS = False
    response = api.post(JOBS, job_body(f"http://{host}:8080/x"), format="json")
    assert response.status_code == 400, response.content
    errors = response.json()
    assert "target" in errors, errors
    assert SWITCH in str(errors["target"]), errors
    from jobs.models import Job

    assert Job.objects.count() == 0


def test_a_private_spelling_is_a_400_at_update_too(api, settings):
    settings.SCHEDULER_ALLOW_PRIVATE_TARGETS = False
    created = api.post(JOBS, job_body("https://example.com/hook"), format="json")
    assert created.status_code == 201, created.content
    url = f"{JOBS}{created.json()['id']}/"
    response = api.patch(
        url, {"target": {"type": "http", "url": f"http://{fullwidth('127.0.0.1')}/x"}}, format="json"
    )
    assert response.status_code == 400, response.content
    assert "target" in response.json() and SWITCH in str(response.json()["target"])
    assert api.get(url).json()["target"]["url"] == "https://example.com/hook"


@pytest.mark.parametrize(
    "url",
    [
        "https://example.com/hook",
        "http://1.1.1.1/x",
        "http://[2606:4700::1111]/x",
        "http://[64:ff9b::808:808]/x",  # NAT64 of a public address
        "http://\u2603.example/x",  # an IDNA name, not an address
    ],
)
def test_public_targets_are_still_accepted(api, settings, url):
    settings.SCHEDULER_ALLOW_PRIVATE_TARGETS = False
    response = api.post(JOBS, job_body(url), format="json")
    assert response.status_code == 201, response.content


# Hosts the HTTP client reads as an IP address (a colon, or only digits and dots) and
# never looks up, but cannot dial as written: whatever the switch, no run could start.
UNDIALLABLE_HOSTS = [
    ("ipv4-mapped-short", "[::ffff:127.1]", "::ffff:7f00:1"),
    ("ipv4-mapped-short-public", "[::ffff:8.8.2056]", "::ffff:808:808"),
    ("not-ipv6", "[zz::1]", None),
    ("five-parts", "[::ffff:1.2.3.4.5]", None),
    ("five-parts-ipv4", "1.2.3.4.5", None),
    ("ipv4-short", "127.1", "127.0.0.1"),
]


@pytest.mark.parametrize("allow_private", [False, True])
@pytest.mark.parametrize(
    ("host", "canonical"), [(h, c) for _, h, c in UNDIALLABLE_HOSTS], ids=[i for i, _, _ in UNDIALLABLE_HOSTS]
)
def test_an_address_the_client_cannot_dial_is_a_400_whatever_the_switch(
    api, settings, host, canonical, allow_private
):
    settings.SCHEDULER_ALLOW_PRIVATE_TARGETS = allow_private
    response = api.post(JOBS, job_body(f"http://{host}:8080/x"), format="json")
    assert response.status_code == 400, response.content
    (message,) = response.json()["target"]
    if not allow_private and canonical and address_refusal(canonical):
        assert SWITCH in message, message  # judged as the address it maps to
    elif canonical:
        assert f"non-canonical form of {canonical}" in message, message
    else:
        assert "is not a valid IP address" in message, message


def test_the_switch_allows_private_spellings(api, settings):
    settings.SCHEDULER_ALLOW_PRIVATE_TARGETS = True
    response = api.post(JOBS, job_body(f"http://{fullwidth('127.0.0.1')}:8080/x"), format="json")
    assert response.status_code == 201, response.content


@pytest.mark.parametrize(
    ("address", "verdict"),
    [
        ("127.0.0.1", "loopback"),
        ("10.1.2.3", "private"),
        ("169.254.169.254", "link-local"),
        ("224.0.0.1", "multicast"),
        ("240.0.0.1", "reserved"),
        ("0.0.0.0", "unspecified"),
        ("100.64.0.1", "not globally routable"),
        ("::1", "loopback"),
        ("fe80::1", "link-local"),
        ("fc00::1", "private"),
        ("ff02::1", "multicast"),
        ("::ffff:10.0.0.1", "private"),
        ("2002:a00:1::", "private"),
        ("64:ff9b::a00:1", "private"),
        ("64:ff9b:1::1", "private"),
        ("8.8.8.8", None),
        ("2606:4700::1111", None),
        ("::ffff:8.8.8.8", None),
        ("2002:808:808::", None),
        ("64:ff9b::808:808", None),
    ],
)
def test_one_classification_for_every_address_family(address, verdict):
    reason = address_refusal(address)
    assert (reason is None) if verdict is None else (reason is not None and reason.endswith(f"is {verdict}"))


def test_the_connector_hooks_exist_in_the_pinned_aiohttp():
    """GuardedConnector overrides aiohttp internals; a rename would silently disable it."""
    for name in ("_resolve_host", "_wrap_create_connection"):
        assert name in vars(aiohttp.TCPConnector), name
        assert vars(GuardedConnector)[name] is not vars(aiohttp.TCPConnector)[name]
    resolve = inspect.signature(aiohttp.TCPConnector._resolve_host).parameters
    assert list(resolve)[:3] == ["self", "host", "port"] and "traces" in resolve
    wrap = inspect.signature(aiohttp.TCPConnector._wrap_create_connection).parameters
    assert {"addr_infos", "req", "timeout"} <= set(wrap)


def test_hosts_are_read_as_addresses_exactly_as_the_client_reads_them():
    """netguard mirrors aiohttp's rule for which hosts it dials without a lookup."""
    from aiohttp.helpers import is_ip_address

    from runs.execution.netguard import _read_as_address

    hosts = ["127.0.0.1", "127.1", "2130706433", "1.2.3.4.5", "0x7f.1", "::1", "zz::1", "example.com", "1e3"]
    hosts += [h.strip("[]") for _, h in PRIVATE_HOSTS] + [h.strip("[]") for _, h, _ in UNDIALLABLE_HOSTS]
    assert {h: _read_as_address(h) for h in hosts} == {h: is_ip_address(h) for h in hosts}


# --- connect time: the validator bypassed, the executor's own check must hold -----------


@pytest.fixture
def big_tenant(transactional_db):
    # Room for every probe in one claim: the default test tenant allows only 10 at once.
    return create_tenant(slug="ssrf", max_concurrency=500)[0]


def execute(keys, *, allow_private: bool, timeout: float = 120) -> dict:
    """Run the real executor in this process, a batch at a time, until every run ended."""
    deadline = time.monotonic() + timeout
    while True:
        Executor(
            conninfo=connections.database_conninfo(),
            allow_private=allow_private,
            concurrency=100,
            grace_seconds=30,
        ).run(once=True)
        runs = {key: row(key) for key in keys}
        if all(run.status in ("succeeded", "dead", "retrying") for run in runs.values()):
            return runs
        assert time.monotonic() < deadline, {k: r.status for k, r in runs.items()}


def test_no_spelling_of_a_private_address_reaches_the_server_at_connect_time(http_target, big_tenant):
    http_target.script("/x", then=Reply(500, body=b"secret response body"))
    probes = {case: f"http://{host}:{http_target.port}/x" for case, host in PRIVATE_HOSTS}
    keys = {}
    for case, url in probes.items():
        # A short timeout: a probe of an address that is not ours would otherwise hang.
        (keys[case],) = queue_runs(big_tenant, http_spec(url, timeout_seconds=3), max_attempts=1)
    runs = execute(list(keys.values()), allow_private=False)

    assert http_target.received() == []
    for case, key in keys.items():
        run = runs[key]
        assert run.status == "dead", (case, run.status, run.last_error)
        assert run.result_code is None, case
        assert "secret" not in run.last_error
        # Spellings aiohttp itself will not dial are refused as invalid URLs; every
        # other one is refused by our connector, naming the address and the switch.
        if "canonical" not in run.last_error:
            assert run.last_error.startswith("refused target: "), (case, run.last_error)
            assert SWITCH in run.last_error and "address " in run.last_error, (case, run.last_error)


@pytest.mark.parametrize("allow_private", [False, True])
def test_an_address_the_client_cannot_dial_fails_permanently_at_connect_time(
    http_target, big_tenant, allow_private
):
    """Stored before the rule existed (the validator bypassed): the connector refuses it
    at once, a permanent failure, not a retry of a bare ValueError."""
    keys = {}
    for case, host, _ in UNDIALLABLE_HOSTS:
        (keys[case],) = queue_runs(
            big_tenant,
            http_spec(f"http://{host}:{http_target.port}/x", timeout_seconds=3),
            max_attempts=3,
            retry_backoff_seconds=0,
            retry_backoff_cap_seconds=0,
        )
    runs = execute(list(keys.values()), allow_private=allow_private)
    for case, key in keys.items():
        run = runs[key]
        assert (run.status, run.attempt) == ("dead", 1), (case, run.status, run.last_error)
        assert run.last_error.startswith("refused target: "), (case, run.last_error)
    assert http_target.received() == []


def test_unicode_loopback_reports_the_normalised_address(http_target, big_tenant):
    (key,) = queue_runs(big_tenant, http_spec(f"http://{fullwidth('127.0.0.1')}:{http_target.port}/x"))
    run = execute([key], allow_private=False)[key]
    assert run.status == "dead" and run.attempt == 1
    assert run.last_error == (
        f"refused target: address 127.0.0.1 is loopback; private targets are not allowed ({SWITCH})"
    )
    assert http_target.received() == []


def test_a_name_resolving_to_loopback_is_refused_at_connect_time(http_target, big_tenant):
    (key,) = queue_runs(big_tenant, http_spec(f"http://localhost:{http_target.port}/x"))
    run = execute([key], allow_private=False)[key]
    assert run.status == "dead" and run.attempt == 1, run.last_error
    assert run.last_error.startswith("refused target: 'localhost' resolves to "), run.last_error
    assert "loopback" in run.last_error and SWITCH in run.last_error
    assert http_target.received() == []


def test_with_the_switch_on_the_same_unicode_url_is_called(http_target, big_tenant):
    (key,) = queue_runs(big_tenant, http_spec(f"http://{circled('127.0.0.1')}:{http_target.port}/x"))
    run = execute([key], allow_private=True)[key]
    assert run.status == "succeeded", run.last_error
    assert len(http_target.received("/x")) == 1


def test_redirects_are_never_followed(http_target, big_tenant):
    http_target.script("/hop", then=Reply(302, headers={"Location": http_target.url("/landed")}))
    (key,) = queue_runs(big_tenant, http_spec(http_target.url("/hop")))
    run = execute([key], allow_private=True)[key]
    assert run.status == "dead" and run.result_code == 302
    assert "redirects are not followed" in run.last_error
    assert len(http_target.received("/hop")) == 1 and http_target.received("/landed") == []
