"""Which addresses the api handler may connect to: resolve a host once and check every address."""

from __future__ import annotations

import ipaddress
import socket
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

IPAddress = ipaddress.IPv4Address | ipaddress.IPv6Address
IPNetwork = ipaddress.IPv4Network | ipaddress.IPv6Network
SocketAddress = tuple[socket.AddressFamily, tuple[Any, ...]]

NAT64 = ipaddress.IPv6Network("64:ff9b::/96")
THIS_NETWORK = ipaddress.IPv4Network("0.0.0.0/8")
# Categories ALLOW_PRIVATE_NETWORKS opens; link-local (cloud metadata), multicast,
# reserved and unspecified addresses need an explicit ALLOWED_NETWORKS entry.
PRIVATE_CATEGORIES = frozenset({"private", "loopback"})


class AddressRefused(Exception):
    """The host cannot be resolved, or none of its addresses is allowed."""


def unwrap(address: IPAddress) -> IPAddress:
    """The IPv4 address an IPv6 address embeds (mapped, 6to4, NAT64), else the address itself."""
    if isinstance(address, ipaddress.IPv6Address):
        if address.ipv4_mapped is not None:
            return address.ipv4_mapped
        if address.sixtofour is not None:
            return address.sixtofour
        if address in NAT64:
            return ipaddress.IPv4Address(int(address) & 0xFFFFFFFF)
    return address


def category(address: IPAddress) -> str:
    """``public``, or the reason the address is refused by default."""
    address = unwrap(address)
    if address.is_unspecified or address in THIS_NETWORK:
        return "unspecified"
    if address.is_loopback:
        return "loopback"
    if address.is_link_local:
        return "link-local"
    if address.is_multicast:
        return "multicast"
    if address.is_reserved:
        return "reserved"
    # fec0::/10 (site-local) is deprecated but still routed inside sites; Python counts it global.
    if address.is_private or not address.is_global or getattr(address, "is_site_local", False):
        return "private"
    return "public"


@dataclass(frozen=True)
class NetworkPolicy:
    """The HTTP settings ALLOW_PRIVATE_NETWORKS and ALLOWED_NETWORKS (CIDRs and host names)."""

    allow_private: bool = False
    networks: tuple[IPNetwork, ...] = ()
    hosts: frozenset[str] = frozenset()

    @classmethod
    def from_settings(cls, http: dict[str, Any]) -> NetworkPolicy:
        networks: list[IPNetwork] = []
        hosts: set[str] = set()
        entries = http.get("ALLOWED_NETWORKS")
        for entry in entries if isinstance(entries, (list, tuple)) else ():
            if not isinstance(entry, str):
                continue
            try:
                networks.append(ipaddress.ip_network(entry.strip(), strict=False))
            except ValueError:
                hosts.add(normalise_host(entry))
        return cls(bool(http.get("ALLOW_PRIVATE_NETWORKS")), tuple(networks), frozenset(hosts))

    def refusal(self, host: str, address: IPAddress) -> str:
        """Why the address may not be used for this host; empty when it may."""
        kind = category(address)
        if kind == "public" or normalise_host(host) in self.hosts:
            return ""
        if self.allow_private and kind in PRIVATE_CATEGORIES:
            return ""
        if any(ip in network for network in self.networks for ip in {address, unwrap(address)}):
            return ""
        return kind

    def resolve(self, host: str, port: int) -> list[SocketAddress]:
        """Resolve the host once; return the allowed addresses in resolver order, or raise AddressRefused."""
        try:
            answers = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
        except (OSError, UnicodeError):
            raise AddressRefused(f"Could not resolve {host}.") from None
        allowed: list[SocketAddress] = []
        refusals: list[str] = []
        for family, _, _, _, sockaddr in _unique(answers):
            reason = self.refusal(host, ipaddress.ip_address(str(sockaddr[0]).split("%")[0]))
            if reason:
                refusals.append(reason)
            else:
                allowed.append((family, sockaddr))
        if not allowed:
            reasons = ", ".join(sorted(set(refusals))) or "no address"
            raise AddressRefused(
                f"The address of {host} is not allowed ({reasons}); "
                "see the HTTP settings ALLOW_PRIVATE_NETWORKS and ALLOWED_NETWORKS."
            )
        return allowed


def normalise_host(host: str) -> str:
    return host.strip().strip("[]").rstrip(".").lower()


def _unique(answers: Iterable[tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    seen: set[tuple[Any, ...]] = set()
    unique = []
    for answer in answers:
        if answer[4] not in seen:
            seen.add(answer[4])
            unique.append(answer)
    return unique
