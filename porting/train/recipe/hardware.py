"""The hardware shape of a cluster node: chips, dies per chip, and the devices software sees.

On a 910C every die is one device and one rank (CANN HCCL guide, "Rank Table Configuration (Atlas A3)":
https://www.hiascend.com/document/detail/en/CANNCommunityEdition/900/API/hcclug/hcclug_000066.html): an Atlas A3 server
with 8 chips shows 16 devices of 64 GB. "13B on 4 x 8 910C" in the field means 32 chips = 64 dies.
A recipe gives ``cluster.server`` (a preset), or ``chips_per_node`` / ``dies_per_chip``, or
``devices_per_node`` alone; the rest is derived here, and values that disagree are refused naming
the key. Also the two other facts of where the nodes meet: ``cluster.master_addr`` must be an address a
node can connect to, and a node rank (``--launch-node``, ``--node-rank``) one the recipe has.
"""

from __future__ import annotations

import ipaddress
import re
from dataclasses import dataclass
from typing import Annotated, Any

from pydantic import AfterValidator

from model_zoo.errors import RecipeError


@dataclass(frozen=True)
class Server:
    chips: int
    dies_per_chip: int
    hbm_gib_per_die: float
    source: str


# Public product pages; two dies (devices, ranks) per A3 chip: https://www.hiascend.com/document/detail/en/CANNCommunityEdition/900/API/hcclug/hcclug_000066.html
SERVERS: dict[str, Server] = {
    "atlas-800t-a3": Server(8, 2, 64.0, "Atlas 800T A3: 8 x 910C, 2 dies of 64 GB each = 16 devices"),
    "atlas-800t-a2": Server(8, 1, 64.0, "Atlas 800T A2: 8 x 910B, one 64 GB device each"),
}


def _int(v: Any) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) and v >= 1 else None


def derive_cluster(raw: Any) -> Any:
    """The raw ``cluster`` mapping with chips_per_node, dies_per_chip and devices_per_node filled in
    (devices = chips x dies). Raises ValueError, naming the key, when given values contradict."""
    if not isinstance(raw, dict):
        return raw
    c = dict(raw)
    server = SERVERS.get(c.get("server")) if isinstance(c.get("server"), str) else None
    if server is not None:
        c.setdefault("device", "ascend")
        c.setdefault("device_hbm_gib", server.hbm_gib_per_die)
        c.setdefault("chips_per_node", server.chips)
        c.setdefault("dies_per_chip", server.dies_per_chip)
        for key, want in (("chips_per_node", server.chips), ("dies_per_chip", server.dies_per_chip)):
            if c[key] != want:
                raise ValueError(f"cluster.{key}: {c[key]} contradicts cluster.server: {c['server']} ({server.source});"
                                 f" drop cluster.{key} or cluster.server")
        if c.get("device") != "ascend":
            raise ValueError(f"cluster.device: {c.get('device')} contradicts cluster.server: {c['server']} (an Ascend "
                             "server); drop cluster.server to plan another device")
    chips, dies, devs = _int(c.get("chips_per_node")), _int(c.get("dies_per_chip")), _int(c.get("devices_per_node"))
    if any(k in c and v is None for k, v in (("chips_per_node", chips), ("dies_per_chip", dies),
                                              ("devices_per_node", devs))):
        return c   # a wrong type or range: the schema names it
    if chips and dies:
        if devs is not None and devs != chips * dies:
            if server is not None:
                raise ValueError(f"cluster.devices_per_node: {devs} contradicts cluster.server: {c['server']} "
                                 f"({server.source}); drop cluster.devices_per_node or cluster.server")
            raise ValueError(f"cluster.devices_per_node: {devs} contradicts cluster.chips_per_node: {chips} x "
                             f"cluster.dies_per_chip: {dies} = {chips * dies} devices (dies); give one or make them agree")
        devs = chips * dies
    elif chips:
        if devs is not None and devs % chips:
            raise ValueError(f"cluster.devices_per_node: {devs} is not a multiple of cluster.chips_per_node: {chips}")
        dies = devs // chips if devs else 1
        devs = chips * dies
    else:
        dies = dies or 1
        devs = devs or dies
        if devs % dies:
            raise ValueError(f"cluster.devices_per_node: {devs} is not a multiple of cluster.dies_per_chip: {dies}")
        chips = devs // dies
    c.update(chips_per_node=chips, dies_per_chip=dies, devices_per_node=devs)
    return c


def shape_line(cluster) -> str:
    """``64 devices (dies) = 4 node(s) x 8 chip(s) x 2 die(s)`` for a validated ClusterSection (Ascend)."""
    world = cluster.nodes * cluster.devices_per_node
    if cluster.device != "ascend":
        return f"{world} devices = {cluster.nodes} node(s) x {cluster.devices_per_node} device(s)"
    server = f", {cluster.server}" if cluster.server else ""
    return (f"{world} devices (dies) = {cluster.nodes} node(s) x {cluster.chips_per_node} chip(s) x "
            f"{cluster.dies_per_chip} die(s){server}")


# --------------------------------------------------------------------------- where the nodes meet
_HOST_LABEL = re.compile(r"^(?!-)[A-Za-z0-9_-]{1,63}(?<!-)$")   # RFC 1123, with the underscore resolvers accept


def address_problem(addr: str) -> str | None:
    """Why ``addr`` cannot be node 0's address for msrun (``cluster.master_addr``), or None. An empty
    string resolves to 0.0.0.0 and would pass a connection check, so it is refused here, with any other
    text that is neither an IP address a node can connect to nor a host name."""
    fix = "expected node 0's IP address or host name as every node sees it, e.g. 10.0.0.1 or 127.0.0.1"
    if not addr.strip():
        return f"is empty; {fix}"
    try:
        ip = ipaddress.ip_address(addr)
    except ValueError:
        labels = addr[:-1].split(".") if addr.endswith(".") else addr.split(".")
        if len(addr) > 253 or not all(_HOST_LABEL.match(x) for x in labels) or addr.replace(".", "").isdigit():
            return f"{addr[:60]!r} is neither an IP address nor a host name; {fix}"
        return None
    if ip.is_unspecified or ip.is_multicast:
        return f"{addr} is {'unspecified' if ip.is_unspecified else 'multicast'}: no node can connect to it; {fix}"
    return None


def _master_addr(v: str) -> str:
    problem = address_problem(v)
    if problem:
        raise ValueError(problem)
    return v


MasterAddr = Annotated[str, AfterValidator(_master_addr)]


def check_node_rank(node_rank: int, nodes: int, option: str) -> None:
    """Refuse a node rank the recipe does not have, before anything waits for the other nodes."""
    if isinstance(node_rank, bool) or not 0 <= node_rank < nodes:
        raise RecipeError(f"{option} {node_rank}: the recipe has {nodes} node(s) (cluster.nodes), so node ranks "
                          f"0..{nodes - 1}; pass one of them")

# On Ascend every padded length is a graph of the whole model compiled on every rank before step 1 (a static
# graph compiles once per input shape: mindspore.cn/docs/en/r2.4.0/model_train/program_form/static_graph_syntax/
# dynamic_shape.html), minutes each at 7B-13B; so at most 4 shapes there, or packing (one shape).
ASCEND_MAX_SHAPES = 4


def ascend_shapes(raw: dict) -> dict:
    """On Ascend, ``batching.bucketing.max_shapes`` defaults to ASCEND_MAX_SHAPES (16 elsewhere)."""
    cluster = raw.get("cluster")
    if not isinstance(cluster, dict) or cluster.get("device") != "ascend":
        return raw
    batching = raw.get("batching") if isinstance(raw.get("batching"), dict) else {}
    bucketing = batching.get("bucketing") if isinstance(batching.get("bucketing"), dict) else {}
    if "max_shapes" in bucketing or ("batching" in raw and not isinstance(raw["batching"], dict)):
        return raw
    return {**raw, "batching": {**batching, "bucketing": {**bucketing, "max_shapes": ASCEND_MAX_SHAPES}}}


def ascend_shapes_problem(r) -> str:
    """Why a validated recipe's bucketing has too many shapes for Ascend, or ""."""
    b = r.batching
    if r.cluster.device != "ascend" or not b.bucketing.enabled or b.packing or b.bucketing.max_shapes <= ASCEND_MAX_SHAPES:
        return ""
    return (f"batching.bucketing.max_shapes: {b.bucketing.max_shapes} on Ascend, expected at most {ASCEND_MAX_SHAPES}: "
            "each shape is a graph compile of the whole model on every rank before step 1 (minutes each at 7B-13B); "
            f"set max_shapes <= {ASCEND_MAX_SHAPES} or batching.packing: true (one shape)")
