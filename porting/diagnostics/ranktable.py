"""HCCL rank tables v1.0 (Atlas 910 / A2, and A3 in AI-Server mode) and v1.2 (A3 / 910C super pod):
generate, check every documented rule, merge per-server tables, compare with a recipe's cluster.

Rules follow the HCCL user guide (rank_table_config_a2/a3/910 pages): string values; ``status``
"completed"; unique ``server_id`` of at most 64 characters; per server unique ``device_id`` and
``host_port``; ``rank_id`` unique, 0..N-1, contiguous per server (no interleaving between
servers); ``device_ip`` IPv4/IPv6, globally unique, one family, required with several servers
(A2) or several super pods (A3); ports in 1..65535 and not 1..1023; v1.2 ``super_pod_list`` with
unique ids, every server in exactly one pod, a pod's servers listed together, ``super_device_id``
unique within a pod, and a NIC's port as primary differing from its port as backup.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import re
from pathlib import Path
from typing import Any, Iterable

from porting.diagnostics import DiagnosticsError

SUPPORTED = ("1.0", "1.2")
MAX_SERVER_ID = 64


@dataclasses.dataclass(frozen=True)
class Problem:
    severity: str   # error | warning
    where: str      # JSON path plus identifying values
    message: str

    def __str__(self) -> str:
        return f"{self.severity}: {self.where}: {self.message}"


# ---------------------------------------------------------------------------------------------
# Loading.

def load(path: str | os.PathLike) -> dict:
    p = Path(path)
    if p.is_dir():
        raise DiagnosticsError(f"{p}: is a directory; pass the rank table JSON file")
    if not p.is_file():
        raise DiagnosticsError(f"{p}: no such rank table file; pass the JSON file RANK_TABLE_FILE points at")
    try:
        raw = p.read_bytes()
    except OSError as e:
        raise DiagnosticsError(f"{p}: cannot read rank table ({e.strerror}); check permissions") from None
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as e:
        raise DiagnosticsError(f"{p}: not UTF-8 text (byte {e.start}); a rank table is a JSON file") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        hint = " (comments are not allowed: delete the // notes copied from the guide)" if "//" in text else ""
        raise DiagnosticsError(f"{p}: invalid JSON at line {e.lineno} column {e.colno}: {e.msg}{hint}") from None
    if not isinstance(data, dict):
        raise DiagnosticsError(f"{p}: top level is {type(data).__name__}; expected a JSON object with "
                               f"status, version, server_count, server_list")
    return data


def _version(table: dict) -> str:
    if "group_list" in table:
        raise DiagnosticsError("legacy rank table format (group_list/instance_list, the old 910 template) is "
                               "not supported; regenerate it as version 1.0 with `port ranktable gen`")
    v = table.get("version")
    if v is None:
        raise DiagnosticsError("rank table has no 'version'; expected \"1.0\" (910/A2) or \"1.2\" (A3 super pod)")
    v = str(v)
    if v not in SUPPORTED:
        extra = " (A5 peer_list/edge_list topology format)" if "peer_list" in table else ""
        raise DiagnosticsError(f"rank table version {v!r}{extra} is not supported; port checks versions "
                               f"{', '.join(SUPPORTED)}")
    return v


# ---------------------------------------------------------------------------------------------
# Field checks, as small typed helpers.

def _as_int(value: Any) -> int | None:
    if isinstance(value, bool):
        return None
    if isinstance(value, int):
        return value
    if isinstance(value, str) and re.fullmatch(r"\d+", value.strip()):
        return int(value)
    return None


def _ip(value: Any) -> ipaddress._BaseAddress | None:
    if not isinstance(value, str):
        return None
    try:
        return ipaddress.ip_address(value.strip())
    except ValueError:
        return None


def _check_ip(field: str, value: Any, where: str, probs: list[Problem], v4_only: bool = False) -> int | None:
    """Returns the IP family (4/6) or None; records a problem for bad values."""
    if isinstance(value, str) and "*" in value:
        probs.append(Problem("warning", where, f"{field} {value!r} is a masked placeholder (documentation "
                                               f"sample); put the real address before use"))
        return None
    ip = _ip(value)
    if ip is None:
        probs.append(Problem("error", where, f"{field} {value!r} is not an IPv4{'' if v4_only else '/IPv6'} address"))
        return None
    if v4_only and ip.version != 4:
        probs.append(Problem("error", where, f"{field} {value!r} must be IPv4"))
    return ip.version


def _check_port(field: str, value: Any, where: str, probs: list[Problem]) -> int | None:
    n = _as_int(value)
    if n is None or not 1 <= n <= 65535:
        probs.append(Problem("error", where, f"{field} {value!r} must be an integer in 1..65535"))
        return None
    if n <= 1023:
        probs.append(Problem("warning", where, f"{field} {n} is a reserved system port (1..1023); use >= 1024"))
    return n


def _string_field(field: str, value: Any, where: str, probs: list[Problem]) -> None:
    if isinstance(value, int) and not isinstance(value, bool):
        probs.append(Problem("warning", where, f"{field} is the integer {value}; the guide writes every value "
                                               f"as a string (\"{value}\")"))


# ---------------------------------------------------------------------------------------------
# The check.

def check(table: dict, *, nodes: int | None = None, cards_per_node: int | None = None) -> list[Problem]:
    """Every documented rule; errors name the entry (server_list[i].device[j], server_id, rank_id)."""
    probs: list[Problem] = []
    version = _version(table)
    status = table.get("status")
    if status is None:
        probs.append(Problem("error", "status", "missing; set \"completed\""))
    elif status != "completed":
        probs.append(Problem("error", "status", f"{status!r}: HCCL uses the table only when status is \"completed\""))
    servers = table.get("server_list")
    if not isinstance(servers, list) or not servers:
        probs.append(Problem("error", "server_list", "missing or empty; expected a list of servers"))
        return probs
    count = table.get("server_count")
    if count is None:
        if version == "1.0":
            probs.append(Problem("error", "server_count", f"missing; expected \"{len(servers)}\""))
    else:
        _string_field("server_count", count, "server_count", probs)
        if _as_int(count) != len(servers):
            probs.append(Problem("error", "server_count", f"{count!r} but server_list has {len(servers)} server(s)"))

    server_ids: dict[str, int] = {}
    rank_owner: dict[int, str] = {}
    device_ips: dict[str, str] = {}
    families: set[int] = set()
    per_server_ranks: list[tuple[str, list[int]]] = []
    primary_ports: dict[str, set[int]] = {}  # device_ip -> ports used as primary
    backup_uses: list[tuple[str, str, int]] = []  # (where, backup ip, backup port)
    total_devices = 0
    missing_ip: list[str] = []
    for i, srv in enumerate(servers):
        sw = f"server_list[{i}]"
        if not isinstance(srv, dict):
            probs.append(Problem("error", sw, "not an object"))
            continue
        sid = srv.get("server_id")
        if sid is None or (isinstance(sid, str) and not sid.strip()):
            probs.append(Problem("error", sw, "server_id is missing"))
            sid = f"#{i}"
        else:
            sid = str(sid)
            sw = f"server_list[{i}] (server_id {sid})"
            if len(sid) > MAX_SERVER_ID:
                probs.append(Problem("error", sw, f"server_id is {len(sid)} characters; at most {MAX_SERVER_ID}"))
            if "*" in sid:
                probs.append(Problem("warning", sw, f"server_id {sid!r} is a masked placeholder (documentation "
                                                    f"sample); uniqueness cannot be checked"))
                sid = f"{sid}#{i}"
                server_ids[sid] = i
            elif sid in server_ids:
                probs.append(Problem("error", sw, f"server_id {sid!r} repeats server_list[{server_ids[sid]}]; "
                                                  f"server ids must be unique"))
            else:
                server_ids[sid] = i
        if "host_ip" in srv:
            _check_ip("host_ip", srv["host_ip"], sw, probs, v4_only=True)
        devices = srv.get("device")
        if not isinstance(devices, list) or not devices:
            probs.append(Problem("error", sw, "device list is missing or empty"))
            continue
        if cards_per_node is not None and len(devices) != cards_per_node:
            probs.append(Problem("error", sw, f"has {len(devices)} device(s); the recipe expects "
                                              f"cards_per_node={cards_per_node}"))
        dev_ids: dict[int, int] = {}
        host_ports: dict[int, int] = {}
        ranks_here: list[int] = []
        for j, dev in enumerate(devices):
            total_devices += 1
            dw = f"{sw}.device[{j}]"
            if not isinstance(dev, dict):
                probs.append(Problem("error", dw, "not an object"))
                continue
            rid = _as_int(dev.get("rank_id"))
            if rid is not None:
                dw = f"{dw} (rank_id {rid})"
            for f in ("device_id", "rank_id", "super_device_id", "device_port", "host_port", "backup_device_port"):
                if f in dev:
                    _string_field(f, dev[f], dw, probs)
            did = _as_int(dev.get("device_id"))
            if "device_id" not in dev:
                probs.append(Problem("error", dw, "device_id is missing (the physical id, /dev/davinciN)"))
            elif did is None:
                probs.append(Problem("error", dw, f"device_id {dev['device_id']!r} is not a non-negative integer"))
            elif did in dev_ids:
                probs.append(Problem("error", dw, f"device_id {did} repeats device[{dev_ids[did]}] on this server "
                                                  f"(HCCL reports EI0004); each physical device appears once"))
            else:
                dev_ids[did] = j
            if "rank_id" not in dev:
                probs.append(Problem("error", dw, "rank_id is missing"))
            elif rid is None:
                probs.append(Problem("error", dw, f"rank_id {dev['rank_id']!r} is not a non-negative integer"))
            elif rid in rank_owner:
                probs.append(Problem("error", dw, f"rank_id {rid} is already used by {rank_owner[rid]}"))
            else:
                rank_owner[rid] = dw
                ranks_here.append(rid)
            if "device_ip" in dev:
                fam = _check_ip("device_ip", dev["device_ip"], dw, probs)
                if fam:
                    families.add(fam)
                    ip = str(dev["device_ip"]).strip()
                    if ip in device_ips:
                        probs.append(Problem("error", dw, f"device_ip {ip} is also used by {device_ips[ip]}; "
                                                          f"device IPs are globally unique"))
                    else:
                        device_ips[ip] = dw
            else:
                missing_ip.append(dw)
            dport = _check_port("device_port", dev["device_port"], dw, probs) if "device_port" in dev else None
            if dport is not None and "device_ip" in dev:
                primary_ports.setdefault(str(dev["device_ip"]).strip(), set()).add(dport)
            if "host_port" in dev:
                hp = _check_port("host_port", dev["host_port"], dw, probs)
                if hp is not None:
                    if hp in host_ports:
                        probs.append(Problem("error", dw, f"host_port {hp} repeats device[{host_ports[hp]}]; "
                                                          f"each device on a server needs its own host_port"))
                    host_ports[hp] = j
            for f in ("super_device_id", "backup_device_ip", "backup_device_port"):
                if f in dev and version == "1.0":
                    probs.append(Problem("warning", dw, f"{f} is a v1.2 (super pod) field; HCCL ignores it in v1.0"))
            if "super_device_id" in dev and _as_int(dev["super_device_id"]) is None:
                probs.append(Problem("error", dw, f"super_device_id {dev['super_device_id']!r} is not an integer"))
            if "backup_device_ip" in dev:
                _check_ip("backup_device_ip", dev["backup_device_ip"], dw, probs)
                if str(dev.get("backup_device_ip")).strip() == str(dev.get("device_ip", "")).strip():
                    probs.append(Problem("error", dw, "backup_device_ip equals device_ip; the backup is the other "
                                                      "die's NIC of the same NPU"))
            if "backup_device_port" in dev:
                bp = _check_port("backup_device_port", dev["backup_device_port"], dw, probs)
                if bp is not None and "backup_device_ip" in dev:
                    backup_uses.append((dw, str(dev["backup_device_ip"]).strip(), bp))
        per_server_ranks.append((sw, ranks_here))

    # ranks: 0..N-1 and contiguous per server, in server order
    if rank_owner:
        n = total_devices
        bad = sorted(r for r in rank_owner if r >= n)
        if bad:
            probs.append(Problem("error", rank_owner[bad[0]], f"rank_id {bad[0]} is outside 0..{n - 1} "
                                                              f"({n} devices in the table)"))
        gaps = sorted(set(range(n)) - set(rank_owner))
        if gaps and not bad:
            probs.append(Problem("error", "server_list", f"rank_id(s) {gaps[:8]} are missing; rank ids must be "
                                                         f"exactly 0..{n - 1}"))
        for sw, ranks in per_server_ranks:
            if ranks and sorted(ranks) != list(range(min(ranks), min(ranks) + len(ranks))):
                probs.append(Problem("error", sw, f"rank ids {sorted(ranks)} are not contiguous; each server's "
                                                  f"ranks must be one block (e.g. {{0,1,2,3}},{{4,5,6,7}})"))
        starts = [(min(r), sw) for sw, r in per_server_ranks if r]
        for (a, swa), (b, swb) in zip(starts, starts[1:]):
            if b < a:
                probs.append(Problem("warning", swb, f"ranks start at {b}, before the previous server's {a}; "
                                                     f"list servers in rank order"))
    if len(families) > 1:
        probs.append(Problem("error", "server_list", "device_ip mixes IPv4 and IPv6; use one family"))
    # backup port must differ from the same NIC's primary port
    for dw, bip, bp in backup_uses:
        if bp in primary_ports.get(bip, set()):
            probs.append(Problem("error", dw, f"backup_device_port {bp} equals the primary device_port of "
                                              f"{bip}; a NIC's primary and backup ports must differ"))
    # super pods
    pods = table.get("super_pod_list")
    if pods is not None and version == "1.0":
        probs.append(Problem("warning", "super_pod_list", "present in a v1.0 table; set version \"1.2\" for super pods"))
    pod_of_server: dict[str, str] = {}
    if version == "1.2" and pods is not None:
        _check_pods(pods, servers, server_ids, pod_of_server, probs)
    multi_domain = (len(servers) > 1 and version == "1.0") or (version == "1.2" and len(set(pod_of_server.values())) > 1)
    if multi_domain and missing_ip:
        what = "several servers" if version == "1.0" else "several super pods"
        probs.append(Problem("error", missing_ip[0], f"device_ip is missing ({len(missing_ip)} device(s)); it is "
                                                     f"required with {what} (read it from /etc/hccn.conf)"))
    if nodes is not None and len(servers) != nodes:
        probs.append(Problem("error", "server_list", f"{len(servers)} server(s); the recipe expects nodes={nodes}"))
    return _collapse_masked(probs)


def _collapse_masked(probs: list[Problem]) -> list[Problem]:
    """One warning for all masked documentation placeholders instead of one per device."""
    masked = [p for p in probs if "masked placeholder (documentation sample); put" in p.message]
    if len(masked) <= 1:
        return probs
    rest = [p for p in probs if p not in masked]
    return rest + [Problem("warning", masked[0].where, f"{masked[0].message.split(' is ')[0]} and {len(masked) - 1} "
                                                       f"more address(es) are masked placeholders (documentation "
                                                       f"sample); put the real addresses before use")]


def _check_pods(pods: Any, servers: list, server_ids: dict[str, int], pod_of_server: dict[str, str],
                probs: list[Problem]) -> None:
    if not isinstance(pods, list) or not pods:
        probs.append(Problem("error", "super_pod_list", "must be a non-empty list of {super_pod_id, server_list}"))
        return
    seen_pods: set[str] = set()
    for k, pod in enumerate(pods):
        pw = f"super_pod_list[{k}]"
        if not isinstance(pod, dict):
            probs.append(Problem("error", pw, "not an object"))
            continue
        pid = pod.get("super_pod_id")
        if pid is None:
            probs.append(Problem("error", pw, "super_pod_id is missing"))
            continue
        pid = str(pid)
        pw = f"super_pod_list[{k}] (super_pod_id {pid})"
        if pid in seen_pods:
            probs.append(Problem("error", pw, f"super_pod_id {pid} is not unique"))
        seen_pods.add(pid)
        members = pod.get("server_list")
        if not isinstance(members, list) or not members:
            probs.append(Problem("error", pw, "server_list is missing or empty"))
            continue
        for m in members:
            sid = str(m.get("server_id")) if isinstance(m, dict) else None
            if sid is None or sid not in server_ids:
                probs.append(Problem("error", pw, f"server_id {sid!r} is not in the top-level server_list"))
            elif sid in pod_of_server:
                probs.append(Problem("error", pw, f"server {sid} is already in super pod {pod_of_server[sid]}"))
            else:
                pod_of_server[sid] = pid
    for sid, i in server_ids.items():
        if sid not in pod_of_server:
            probs.append(Problem("error", f"server_list[{i}] (server_id {sid})", "not in any super pod of super_pod_list"))
    # a pod's servers listed together
    order = [pod_of_server.get(str(s.get("server_id"))) for s in servers if isinstance(s, dict)]
    closed: set[str] = set()
    prev = None
    for i, pid in enumerate(order):
        if pid is None:
            continue
        if pid != prev and pid in closed:
            probs.append(Problem("error", f"server_list[{i}]", f"servers of super pod {pid} are not listed together; "
                                                               f"list each pod's servers as one block"))
        if prev is not None and pid != prev:
            closed.add(prev)
        prev = pid
    # super_device_id unique within a pod
    seen: dict[tuple[str, int], str] = {}
    for i, s in enumerate(servers):
        if not isinstance(s, dict):
            continue
        pid = pod_of_server.get(str(s.get("server_id")))
        for j, dev in enumerate(s.get("device") or []):
            sd = _as_int(dev.get("super_device_id")) if isinstance(dev, dict) else None
            if pid is None or sd is None:
                continue
            where = f"server_list[{i}] (server_id {s.get('server_id')}).device[{j}]"
            if (pid, sd) in seen:
                probs.append(Problem("error", where, f"super_device_id {sd} repeats {seen[(pid, sd)]} in super pod {pid}"))
            else:
                seen[(pid, sd)] = where


def summary(table: dict) -> dict:
    servers = [s for s in table.get("server_list") or [] if isinstance(s, dict)]
    return {"version": str(table.get("version")), "servers": len(servers),
            "devices": sum(len(s.get("device") or []) for s in servers),
            "devices_per_server": sorted({len(s.get("device") or []) for s in servers}),
            "super_pods": len(table.get("super_pod_list") or [])}


# ---------------------------------------------------------------------------------------------
# Recipe cluster section (read directly: no dependency on the train code).

def recipe_cluster(path: str | os.PathLike) -> tuple[int | None, int | None]:
    import yaml

    p = Path(path)
    try:
        data = yaml.safe_load(p.read_text())
    except OSError as e:
        raise DiagnosticsError(f"{p}: cannot read recipe ({e.strerror})") from None
    except yaml.YAMLError as e:
        raise DiagnosticsError(f"{p}: invalid YAML: {str(e).splitlines()[0]}") from None
    cluster = (data or {}).get("cluster") if isinstance(data, dict) else None
    if not isinstance(cluster, dict):
        raise DiagnosticsError(f"{p}: no 'cluster' section; expected cluster.nodes and cluster.cards_per_node "
                               f"(or devices_per_node) "
                               f"(or pass --nodes/--cards-per-node)")
    vals = []
    # `port train` recipes call it devices_per_node; the spelling is cards_per_node
    for key, alias in (("nodes", "nodes"), ("cards_per_node", "devices_per_node")):
        if key in cluster and alias != key and alias in cluster and cluster[key] != cluster[alias]:
            raise DiagnosticsError(f"{p}: cluster.{key}={cluster[key]!r} and cluster.{alias}={cluster[alias]!r} "
                                   f"disagree; keep one")
        v = cluster.get(key, cluster.get(alias))
        key = key if key in cluster or alias not in cluster else alias
        if v is not None and (not isinstance(v, int) or isinstance(v, bool) or v < 1):
            raise DiagnosticsError(f"{p}: cluster.{key} is {v!r}; expected a positive integer")
        vals.append(v)
    return vals[0], vals[1]


# ---------------------------------------------------------------------------------------------
# Generation and merging.

def parse_hccn_conf(path: str | os.PathLike) -> dict[int, str]:
    """address_<device_id>=<ip> lines of /etc/hccn.conf."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as e:
        raise DiagnosticsError(f"{p}: cannot read hccn.conf ({e.strerror})") from None
    out: dict[int, str] = {}
    for line in text.splitlines():
        m = re.match(r"\s*address_(\d+)\s*=\s*(\S+)", line)
        if m:
            out[int(m.group(1))] = m.group(2)
    if not out:
        raise DiagnosticsError(f"{p}: no address_<N>=<ip> lines; expected the device NIC config of `hccn_tool`")
    return out


def generate(servers: list[dict], *, version: str = "1.0", super_pod_size: int | None = None) -> dict:
    """servers: [{"server_id", "host_ip"?, "devices": [{"device_id", "device_ip"?, ...}]}] in rank order."""
    if version not in SUPPORTED:
        raise DiagnosticsError(f"--version {version!r}: expected one of {', '.join(SUPPORTED)}")
    if not servers:
        raise DiagnosticsError("no servers given; pass --server ID[:HOST_IP] at least once")
    rank = 0
    out_servers = []
    for si, s in enumerate(servers):
        devs = []
        for di, d in enumerate(s["devices"]):
            dev = {"device_id": str(d["device_id"])}
            if d.get("device_ip"):
                dev["device_ip"] = d["device_ip"]
            if version == "1.2":
                pod_index = si % super_pod_size if super_pod_size else si
                dev["super_device_id"] = str(pod_index * len(s["devices"]) + di)
            dev["rank_id"] = str(rank)
            rank += 1
            devs.append(dev)
        entry = {"server_id": s["server_id"]}
        if s.get("host_ip"):
            entry["host_ip"] = s["host_ip"]
        entry["device"] = devs
        out_servers.append(entry)
    table = {"status": "completed", "version": version, "server_count": str(len(out_servers)),
             "server_list": out_servers}
    if version == "1.2":
        size = super_pod_size or len(out_servers)
        table["super_pod_list"] = [
            {"super_pod_id": str(k), "server_list": [{"server_id": s["server_id"]} for s in out_servers[i:i + size]]}
            for k, i in enumerate(range(0, len(out_servers), size))]
    return table


def merge(tables: list[tuple[str, dict]]) -> dict:
    """Concatenate per-server tables in the given order; rank ids renumbered 0..N-1."""
    if len(tables) < 2:
        raise DiagnosticsError("merge needs at least two rank tables")
    versions = {name: _version(t) for name, t in tables}
    if len(set(versions.values())) > 1:
        raise DiagnosticsError("cannot merge different versions: " + ", ".join(f"{n}={v}" for n, v in versions.items()))
    version = next(iter(versions.values()))
    servers: list[dict] = []
    owner: dict[str, str] = {}
    pods: dict[str, list[dict]] = {}
    for name, t in tables:
        sl = t.get("server_list")
        if not isinstance(sl, list) or not sl:
            raise DiagnosticsError(f"{name}: server_list is missing or empty")
        for s in sl:
            sid = str(s.get("server_id"))
            if sid in owner:
                raise DiagnosticsError(f"{name}: server_id {sid!r} is also in {owner[sid]}; each server once")
            owner[sid] = name
            servers.append(json.loads(json.dumps(s)))
        for pod in t.get("super_pod_list") or []:
            pods.setdefault(str(pod.get("super_pod_id")), []).extend(pod.get("server_list") or [])
    rank = 0
    for s in servers:
        for d in s.get("device") or []:
            d["rank_id"] = str(rank)
            rank += 1
    out = {"status": "completed", "version": version, "server_count": str(len(servers)), "server_list": servers}
    if version == "1.2" and pods:
        # keep each pod's servers together: order servers by pod, stable within a pod
        pod_of = {str(m.get("server_id")): pid for pid, ms in pods.items() for m in ms}
        order = list(pods)
        servers.sort(key=lambda s: order.index(pod_of.get(str(s.get("server_id")), order[-1])))
        rank = 0
        for s in servers:
            for d in s.get("device") or []:
                d["rank_id"] = str(rank)
                rank += 1
        out["super_pod_list"] = [{"super_pod_id": pid, "server_list": ms} for pid, ms in pods.items()]
    return out


def write_table(table: dict, out: Path) -> None:
    """Atomic write: a temporary file renamed over the target."""
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_name(out.name + ".tmp")
    tmp.write_text(json.dumps(table, indent=4) + "\n")
    os.replace(tmp, out)


def errors_of(probs: Iterable[Problem]) -> list[Problem]:
    return [p for p in probs if p.severity == "error"]
