"""Rank-table entries as pydantic models: a device, a server, a super pod, the table.

Field rules (types, ranges, addresses) live here as validators; rules across entries (uniqueness,
contiguity, pods) are in :mod:`porting.cluster.ranktable`, which validates entry by entry so that one
bad entry does not hide the others' problems.
"""

from __future__ import annotations

import ipaddress
import re
from typing import Annotated, Any, Optional

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field

# ---------------------------------------------------------------------------------------------
# Field types.

def nonneg_int(value: Any) -> int:
    """A number written as a string ("3") or, tolerated with a warning elsewhere, as an integer."""
    if isinstance(value, int) and not isinstance(value, bool) and value >= 0:
        return value
    if isinstance(value, str) and re.fullmatch(r"\d+", value.strip()):
        return int(value)
    raise ValueError("is not a non-negative integer")


def _port(value: Any) -> int:
    try:
        n = nonneg_int(value)
    except ValueError:
        n = -1
    if not 1 <= n <= 65535:
        raise ValueError("must be an integer in 1..65535")
    return n


def _address(value: Any) -> str:
    """An IPv4/IPv6 address, or a masked documentation placeholder ("10.*.*.1"), kept as written."""
    if not isinstance(value, str):
        raise ValueError("is not an IPv4/IPv6 address")
    text = value.strip()
    if "*" in text:
        return text
    try:
        ipaddress.ip_address(text)
    except ValueError:
        raise ValueError("is not an IPv4/IPv6 address") from None
    return text


NonNegInt = Annotated[int, BeforeValidator(nonneg_int)]
Port = Annotated[int, BeforeValidator(_port)]
Address = Annotated[str, BeforeValidator(_address)]


class _Entry(BaseModel):
    # Real tables carry keys the guide lists as reserved (host_nic_ip, pod_ip, ...): kept, not refused.
    model_config = ConfigDict(extra="allow", frozen=True)


class Device(_Entry):
    device_id: NonNegInt
    rank_id: NonNegInt
    device_ip: Optional[Address] = None
    device_port: Optional[Port] = None
    host_port: Optional[Port] = None
    super_device_id: Optional[NonNegInt] = None
    backup_device_ip: Optional[Address] = None
    backup_device_port: Optional[Port] = None


class ServerHead(_Entry):
    """A server without its devices (those are validated one by one)."""
    server_id: Annotated[str, BeforeValidator(lambda v: str(v) if isinstance(v, (int, str)) and str(v).strip()
                                              else _missing())]
    host_ip: Optional[Address] = None


def _missing() -> str:
    raise ValueError("is missing")


class Server(ServerHead):
    device: list[Device] = Field(min_length=1)


class PodMember(_Entry):
    server_id: str


class SuperPod(_Entry):
    super_pod_id: Annotated[str, BeforeValidator(lambda v: str(v) if isinstance(v, (int, str)) else _missing())]
    server_list: list[PodMember] = Field(min_length=1)


class RankTable(_Entry):
    version: str
    status: Optional[str] = None
    server_count: Optional[NonNegInt] = None
    server_list: list[Server] = Field(min_length=1)
    super_pod_list: Optional[list[SuperPod]] = None

    @property
    def world_size(self) -> int:
        return sum(len(s.device) for s in self.server_list)

    def rank_of_ip(self) -> dict[str, int]:
        """device_ip (and host_ip, for the first rank of a server) -> rank_id: who a peer address is."""
        out: dict[str, int] = {}
        for s in self.server_list:
            if s.host_ip and s.device:
                out.setdefault(s.host_ip, min(d.rank_id for d in s.device))
            for d in s.device:
                if d.device_ip:
                    out[d.device_ip] = d.rank_id
        return out
