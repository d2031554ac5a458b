"""SSRF guard: targets on loopback, private, link-local, multicast, reserved or
unspecified addresses are refused unless SCHEDULER_ALLOW_PRIVATE_TARGETS is set.

Two checks, one classification (`address_refusal`):
- when a job is saved, on the host *as the HTTP client will see it*: yarl (which
  aiohttp uses) maps fullwidth, circled, superscript or mathematical digits and the
  U+3002/U+FF0E full stops to `127.0.0.1` through IDNA/UTS-46, so judging the raw
  string would let them through;
- at connect time (runs.targets.GuardedConnector) on every address about to be
  dialled, literals included, so DNS (rebinding, `localhost`) cannot sneak past.
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
    bare = host[1:-1] if host.startswith("[") and host.endswith("]") else host
    try:
        return ipaddress.ip_address(bare)
    except ValueError:
        pass
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
    if allow_private:
        return host
    name = host.rstrip(".").lower()
    if name == "localhost" or name.endswith(_LOCAL_NAMES):
        raise UnsafeTarget(refusal_message(f"host '{name}' is a local name"))
    literal = parse_ip_host(host)
    if literal is None:
        return host
    written = host.strip("[]").lower()
    reason = address_refusal(literal)
    if reason is not None:
        shown = "" if written == str(literal) else f" (host {host})"
        raise UnsafeTarget(refusal_message(f"{reason}{shown}"))
    if isinstance(literal, ipaddress.IPv4Address) and written != str(literal):
        # aiohttp refuses non-canonical IPv4 forms at connect time; say so now.
        raise UnsafeTarget(f"host {host} is a non-canonical form of {literal}; write it as {literal}")
    return host
