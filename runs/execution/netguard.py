"""SSRF guard: targets on loopback, private, link-local, multicast, reserved or
unspecified addresses are refused unless SCHEDULER_ALLOW_PRIVATE_TARGETS is set.

Two checks, one classification (`address_refusal`):
- when a job is saved, on the host *as the HTTP client will see it*: yarl (which
  aiohttp uses) maps fullwidth, circled, superscript or mathematical digits and the
  U+3002/U+FF0E full stops to `127.0.0.1` through IDNA/UTS-46, so judging the raw
  string would let them through;
- at connect time (runs.execution.targets.GuardedConnector) on every address about to be
  dialled, literals included, so DNS (rebinding, `localhost`) cannot sneak past.

A host the client reads as an address (`literal_refusal`) is judged as the address it
denotes in any spelling (`[::ffff:127.1]` is 127.0.0.1), and refused whatever the
switch when the client cannot dial it as written: no run of it could ever start.
"""

from __future__ import annotations

import ipaddress
import string

from yarl import URL

SWITCH = "SCHEDULER_ALLOW_PRIVATE_TARGETS"
IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address

# NAT64 well-known prefix (RFC 6052): the last 32 bits are the IPv4 address dialled.
_NAT64 = ipaddress.ip_network("64:ff9b::/96")
# Local-use NAT64 (RFC 8215): translates into whatever the local network chooses.
_NAT64_LOCAL = ipaddress.ip_network("64:ff9b:1::/48")
_LOCAL_NAMES = ("localhost", ".localhost", ".local", ".internal")


class UnsafeTarget(ValueError):
    pass


def address_refusal(address: str | IPAddress) -> str | None:
    """Why connecting to `address` is refused ("address 127.0.0.1 is loopback"), or None.

    IPv6 forms that carry an IPv4 address (mapped, 6to4, NAT64) are judged by the IPv4
    address the packets end up at.
    """
    ip = ipaddress.ip_address(address) if isinstance(address, str) else address
    if isinstance(ip, ipaddress.IPv6Address):
        if ip in _NAT64_LOCAL:
            return f"address {ip} (local-use NAT64) is private"
        for label, embedded in (
            ("IPv4-mapped", ip.ipv4_mapped),
            ("6to4", ip.sixtofour),
            ("NAT64", ipaddress.IPv4Address(int(ip) & 0xFFFFFFFF) if ip in _NAT64 else None),
        ):
            if embedded is not None:
                reason = _reason(embedded)
                return f"address {ip} ({label} {embedded}) is {reason}" if reason else None
    reason = _reason(ip)
    return f"address {ip} is {reason}" if reason else None


def _reason(ip: IPAddress) -> str | None:
    # Most specific first, so the message says what the address is.
    for reason, hit in (
        ("unspecified", ip.is_unspecified),
        ("loopback", ip.is_loopback),
        ("link-local", ip.is_link_local),
        ("multicast", ip.is_multicast),
        ("reserved", ip.is_reserved),
        ("private", ip.is_private),
        # e.g. 100.64.0.0/10 (carrier-grade NAT): neither private nor global.
        ("not globally routable", not ip.is_global),
    ):
        if hit:
            return reason
    return None


def is_public_address(address: str) -> bool:
    return address_refusal(address) is None


def refusal_message(reason: str) -> str:
    """The text a tenant sees, naming the switch an operator would flip."""
    return f"{reason}; private targets are not allowed ({SWITCH})"


def parse_ip_host(host: str) -> IPAddress | None:
    """The address a host string denotes if it is an IP literal, in any form libc takes.

    Besides dotted quads and IPv6 this accepts the legacy IPv4 forms inet_aton and the
    WHATWG URL standard accept (`2130706433`, `0x7f.1`, `0177.0.0.1`, `127.1`), with
    or without a trailing dot. A host that is not such a literal is a name: None.
    Raises UnsafeTarget for a numeric host whose value does not fit an address.
    """
    bare = _bare(host)
    try:
        return ipaddress.ip_address(bare)
    except ValueError:
        pass
    if ":" in bare:
        return _ipv6_with_legacy_ipv4(bare)
    parts = bare.split(".")
    if len(parts) > 1 and parts[-1] == "":
        parts.pop()  # a trailing dot (FQDN form) does not make it a name
    if not 1 <= len(parts) <= 4:
        return None
    numbers = []
    for part in parts:
        number = _ipv4_number(part)
        if number is None:
            return None
        numbers.append(number)
    *head, last = numbers
    if any(n > 255 for n in head) or last >= 256 ** (5 - len(numbers)):
        raise UnsafeTarget(f"host {host} looks like an IPv4 address but is out of range")
    value = last
    for index, number in enumerate(head):
        value += number << (8 * (3 - index))
    return ipaddress.IPv4Address(value)


def _bare(host: str) -> str:
    return host[1:-1] if host.startswith("[") and host.endswith("]") else host


def _ipv6_with_legacy_ipv4(bare: str) -> ipaddress.IPv6Address | None:
    """`::ffff:127.1`: IPv6 whose trailing IPv4 part is in a legacy form (the address it
    denotes, which the socket layer will not parse), else None."""
    head, _, tail = bare.rpartition(":")
    embedded = parse_ip_host(tail) if "." in tail else None
    if not isinstance(embedded, ipaddress.IPv4Address):
        return None
    try:
        return ipaddress.IPv6Address(f"{head}:{embedded}")
    except ValueError:
        return None


def _read_as_address(bare: str) -> bool:
    """Whether aiohttp takes the host for an address and dials it without a lookup
    (aiohttp.helpers.is_ip_address, mirrored: tests/test_ssrf.py compares them)."""
    return ":" in bare or bare.replace(".", "").isdigit()


def literal_refusal(host: str, *, allow_private: bool) -> str | None:
    """Why a host written as an IP address must not be dialled, or None (a name, or an
    address that may be): refused by the SSRF rule (unless allowed), or spelt in a form
    the client cannot dial (whatever the switch)."""
    bare = _bare(host)
    shown = f"[{bare}]" if ":" in bare else bare
    try:
        literal = parse_ip_host(bare)
    except UnsafeTarget as exc:
        return str(exc)
    if literal is None:
        return f"host {shown} is not a valid IP address" if _read_as_address(bare) else None
    written = bare.lower()
    if not allow_private:
        reason = address_refusal(literal)
        if reason is not None:
            note = "" if written == str(literal) else f" (host {shown})"
            return refusal_message(f"{reason}{note}")
    if not _dialable_as_written(written, literal):
        canonical = f"[{literal}]" if literal.version == 6 else str(literal)
        return f"host {shown} is a non-canonical form of {literal}; write it as {canonical}"
    return None


def _dialable_as_written(written: str, literal: IPAddress) -> bool:
    # aiohttp refuses every IPv4 form but the dotted quad; the socket layer takes any
    # IPv6 spelling ipaddress does, but no legacy IPv4 part inside one.
    if literal.version == 4:
        return written == str(literal)
    try:
        ipaddress.IPv6Address(written)
    except ValueError:
        return False
    return True


def _ipv4_number(part: str) -> int | None:
    if part[:2].lower() == "0x":
        digits, base = part[2:], 16
        alphabet = string.hexdigits
    elif len(part) > 1 and part.startswith("0"):
        digits, base = part[1:], 8
        alphabet = string.octdigits
    else:
        digits, base = part, 10
        alphabet = string.digits
    if not digits:
        return 0 if base == 16 else None  # "0x" alone is 0 to inet_aton and WHATWG
    if not all(c in alphabet for c in digits):
        return None
    return int(digits, base)


def check_url(url: str, *, allow_private: bool) -> str:
    """Raise UnsafeTarget unless `url` is an http(s) URL whose host may be called.

    Judges the host exactly as aiohttp will connect to it (yarl's `raw_host`, after
    IDNA/UTS-46 mapping). A name is not resolved here: one that does not resolve yet
    must not fail a create; the connector judges the addresses it resolves to.
    Returns the host as the client sees it.
    """
    try:
        parsed = URL(url)
        port = parsed.port
    except (ValueError, TypeError) as exc:  # a port out of range, a malformed IPv6 host
        raise UnsafeTarget(f"is not a valid URL ({exc})") from exc
    host = parsed.raw_host
    if parsed.scheme not in ("http", "https") or not host:
        raise UnsafeTarget("must be an http:// or https:// URL with a host")
    if port == 0:
        raise UnsafeTarget("port 0 is not a valid target port")
    problem = literal_refusal(host, allow_private=allow_private)
    if problem is not None:
        raise UnsafeTarget(problem)
    name = host.rstrip(".").lower()
    if not allow_private and (name == "localhost" or name.endswith(_LOCAL_NAMES)):
        raise UnsafeTarget(refusal_message(f"host '{name}' is a local name"))
    return host
