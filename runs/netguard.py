"""SSRF guard: targets on loopback, private or link-local networks are refused unless
SCHEDULER_ALLOW_PRIVATE_TARGETS is set. Checked when a job is saved (by name/literal)
and again at connect time on the resolved addresses, so DNS cannot be used to sneak
a private address past the first check.
"""

from __future__ import annotations

import ipaddress
import socket
from urllib.parse import urlsplit


class UnsafeTarget(ValueError):
    pass


def is_public_address(address: str) -> bool:
    ip = ipaddress.ip_address(address)
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped:
        ip = ip.ipv4_mapped
    # is_global excludes loopback, RFC 1918, link-local, CGNAT, documentation ranges...
    return ip.is_global and not ip.is_multicast


def check_url(url: str, *, allow_private: bool, resolve: bool = True) -> None:
    """Raise UnsafeTarget for a non-http(s) URL or one whose host is not public.

    With resolve=False only literal addresses and obviously-local names are judged
    (used at save time so an unresolvable name does not fail a create).
    """
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:  # a port out of range, a malformed IPv6 literal
        raise UnsafeTarget(f"is not a valid URL ({exc})") from exc
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise UnsafeTarget("must be an http:// or https:// URL with a host")
    if port == 0:
        raise UnsafeTarget("port 0 is not a valid target port")
    if allow_private:
        return
    host = parts.hostname.rstrip(".").lower()
    if host == "localhost" or host.endswith(".localhost") or host.endswith(".local"):
        raise UnsafeTarget(f"'{host}' is a local host name; private targets are not allowed")
    try:
        literal = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is not None:
        if not is_public_address(str(literal)):
            raise UnsafeTarget(
                f"{host} is a loopback/private/link-local address; private targets are not allowed"
            )
        return
    if not resolve:
        return
    for address in resolve_host(host, port or (443 if parts.scheme == "https" else 80)):
        if not is_public_address(address):
            raise UnsafeTarget(
                f"'{host}' resolves to {address}, a private address; private targets are not allowed"
            )


def resolve_host(host: str, port: int) -> list[str]:
    try:
        infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
    except socket.gaierror as exc:
        raise UnsafeTarget(f"cannot resolve '{host}': {exc.strerror}") from exc
    return sorted({info[4][0] for info in infos})
