"""HCCL rank tables v1.0 (Atlas 910 / A2, and A3 in AI-Server mode) and v1.2 (A3 / 910C super pod)
as pydantic models, and every documented rule as a check that names the entry it is about.

Rules follow the HCCL user guide (rank_table_config_a2/a3/910 pages): string values; ``status``
"completed"; unique ``server_id`` of at most 64 characters; per server unique ``device_id`` and
``host_port``; ``rank_id`` unique, 0..N-1, contiguous per server (no interleaving between
servers); ``device_ip`` IPv4/IPv6, globally unique, one family, required with several servers
(A2) or several super pods (A3); ports in 1..65535 and not 1..1023; v1.2 ``super_pod_list`` with
unique ids, every server in exactly one pod, a pod's servers listed together, ``super_device_id``
unique within a pod, and a NIC's port as primary differing from its port as backup.

Field rules (types, ranges, addresses) are the models' validators; rules across entries
(uniqueness, contiguity, pods) are small functions over the typed table. Every device, server and
pod is validated on its own, so one bad entry does not hide the problems of the others: all are
reported together, as :class:`Problem` records.
"""

from __future__ import annotations

import dataclasses
import ipaddress
import os
from pathlib import Path
from typing import Any, Iterable

from pydantic import BaseModel, ValidationError

from model_zoo.errors import DiagnosticsError
from model_zoo.files import parse_json, read_text
from porting.cluster.ranktable_models import Device, RankTable, Server, ServerHead, SuperPod, nonneg_int  # noqa: F401

SUPPORTED = ("1.0", "1.2")
MAX_SERVER_ID = 64
MAX_TABLE_BYTES = 16 << 20   # a 4,096-device table is ~1 MB
MAX_TABLE_DEPTH = 16         # a rank table nests 6 levels


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
    """The raw table (a JSON object), bounded in size and depth; one-line errors."""
    p = Path(path)
    if p.is_dir():
        raise DiagnosticsError(f"{p}: is a directory; pass the rank table JSON file")
    if not p.exists():
        raise DiagnosticsError(f"{p}: no such rank table file; pass the JSON file RANK_TABLE_FILE points at")
    text = read_text(p, what="rank table", max_bytes=MAX_TABLE_BYTES, error=DiagnosticsError)
    try:
        data = parse_json(text, where=str(p), what="rank table JSON", max_depth=MAX_TABLE_DEPTH, error=DiagnosticsError)
    except DiagnosticsError as e:
        hint = " (comments are not allowed: delete the // notes copied from the guide)" if "//" in text else ""
        raise DiagnosticsError(f"{e}{hint}") from None
    if not isinstance(data, dict):
        raise DiagnosticsError(f"{p}: top level is {type(data).__name__}; expected a JSON object with "
                               f"status, version, server_count, server_list")
    return data


def version_of(table: dict) -> str:
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


def parse(table: dict) -> RankTable:
    """The typed table, or one error naming the first problem (use :func:`check` for all of them)."""
    errs = errors_of(check(table))
    if errs:
        raise DiagnosticsError(f"invalid rank table: {len(errs)} error(s); first: {errs[0].where}: {errs[0].message}")
    return RankTable.model_validate(table)


# ---------------------------------------------------------------------------------------------
# Field validation, entry by entry.

_MISSING_HINT = {"device_id": " (the physical id, /dev/davinciN)", "server_id": "", "rank_id": ""}


def _field_problems(where: str, exc: ValidationError, raw: dict) -> list[Problem]:
    out = []
    for e in exc.errors():
        field = str(e["loc"][0]) if e["loc"] else ""
        if e["type"] == "missing" or (e["type"] == "value_error" and "is missing" in e["msg"]):
            out.append(Problem("error", where, f"{field} is missing{_MISSING_HINT.get(field, '')}"))
        elif field in ("device", "server_list") and e["type"] in ("too_short", "list_type"):
            out.append(Problem("error", where, f"{field} list is missing or empty"))
        else:
            msg = e["msg"].removeprefix("Value error, ")
            out.append(Problem("error", where, f"{field} {raw.get(field)!r} {msg}"))
    return out


def _validated(model: type[BaseModel], raw: Any, where: str, probs: list[Problem]) -> Any:
    if not isinstance(raw, dict):
        probs.append(Problem("error", where, "not an object"))
        return None
    try:
        return model.model_validate(raw)
    except ValidationError as exc:
        probs.extend(_field_problems(where, exc, raw))
        return None


@dataclasses.dataclass
class _Parsed:
    """The entries that passed field validation, with where each one is."""
    servers: list[tuple[str, ServerHead | None, list[tuple[str, Device]]]]
    raw_devices: int
    pods: list[tuple[str, SuperPod]] | None


def _server_where(i: int, raw: Any) -> str:
    sid = raw.get("server_id") if isinstance(raw, dict) else None
    return f"server_list[{i}]" + (f" (server_id {sid})" if sid not in (None, "") else "")


def _device_where(sw: str, j: int, raw: Any) -> str:
    rid = raw.get("rank_id") if isinstance(raw, dict) else None
    try:
        return f"{sw}.device[{j}] (rank_id {nonneg_int(rid)})"
    except ValueError:
        return f"{sw}.device[{j}]"


def _parse_entries(table: dict, probs: list[Problem]) -> _Parsed | None:
    servers = table.get("server_list")
    if not isinstance(servers, list) or not servers:
        probs.append(Problem("error", "server_list", "missing or empty; expected a list of servers"))
        return None
    parsed, raw_devices = [], 0
    for i, srv in enumerate(servers):
        sw = _server_where(i, srv)
        head = _validated(ServerHead, {k: v for k, v in srv.items() if k != "device"} if isinstance(srv, dict)
                          else srv, sw, probs)
        devices = srv.get("device") if isinstance(srv, dict) else None
        if isinstance(srv, dict) and (not isinstance(devices, list) or not devices):
            probs.append(Problem("error", sw, "device list is missing or empty"))
            devices = []
        devs = []
        for j, dev in enumerate(devices or []):
            raw_devices += 1
            dw = _device_where(sw, j, dev)
            d = _validated(Device, dev, dw, probs)
            if d is not None:
                devs.append((dw, d))
        parsed.append((sw, head, devs))
    pods = None
    if "super_pod_list" in table:
        raw_pods = table["super_pod_list"]
        if not isinstance(raw_pods, list) or not raw_pods:
            probs.append(Problem("error", "super_pod_list", "must be a non-empty list of {super_pod_id, server_list}"))
            pods = []
        else:
            pods = [(f"super_pod_list[{k}]", p) for k, raw in enumerate(raw_pods)
                    if (p := _validated(SuperPod, raw, f"super_pod_list[{k}]", probs)) is not None]
    return _Parsed(parsed, raw_devices, pods)


# ---------------------------------------------------------------------------------------------
# Rules across entries. Each takes the parsed entries and appends Problems.

def _top_rules(table: dict, version: str, n_servers: int, probs: list[Problem]) -> None:
    status = table.get("status")
    if status is None:
        probs.append(Problem("error", "status", "missing; set \"completed\""))
    elif status != "completed":
        probs.append(Problem("error", "status", f"{status!r}: HCCL uses the table only when status is \"completed\""))
    count = table.get("server_count")
    if count is None:
        if version == "1.0":
            probs.append(Problem("error", "server_count", f"missing; expected \"{n_servers}\""))
        return
    try:
        ok = nonneg_int(count) == n_servers
    except ValueError:
        ok = False
    if not ok:
        probs.append(Problem("error", "server_count", f"{count!r} but server_list has {n_servers} server(s)"))


def _string_warnings(table: dict, probs: list[Problem]) -> None:
    """The guide writes every value as a string; an integer works with some tools, not all."""
    fields = ("device_id", "rank_id", "super_device_id", "device_port", "host_port", "backup_device_port")
    if isinstance(table.get("server_count"), int) and not isinstance(table["server_count"], bool):
        probs.append(_int_warning("server_count", "server_count", table["server_count"]))
    for i, srv in enumerate(table.get("server_list") or []):
        sw = _server_where(i, srv)
        for j, dev in enumerate((srv.get("device") if isinstance(srv, dict) else None) or []):
            if not isinstance(dev, dict):
                continue
            for f in fields:
                if isinstance(dev.get(f), int) and not isinstance(dev[f], bool):
                    probs.append(_int_warning(_device_where(sw, j, dev), f, dev[f]))


def _int_warning(where: str, field: str, value: int) -> Problem:
    return Problem("warning", where, f"{field} is the integer {value}; the guide writes every value as a string "
                                     f"(\"{value}\")")


def _server_rules(p: _Parsed, cards_per_node: int | None, probs: list[Problem]) -> dict[str, int]:
    """server_id unique and short; per server unique device_id and host_port. Returns server_id -> index."""
    ids: dict[str, int] = {}
    for i, (sw, head, devs) in enumerate(p.servers):
        if head is not None:
            sid = head.server_id
            if len(sid) > MAX_SERVER_ID:
                probs.append(Problem("error", sw, f"server_id is {len(sid)} characters; at most {MAX_SERVER_ID}"))
            if "*" in sid:
                probs.append(Problem("warning", sw, f"server_id {sid!r} is a masked placeholder (documentation "
                                                    f"sample); uniqueness cannot be checked"))
                ids[f"{sid}#{i}"] = i
            elif sid in ids:
                probs.append(Problem("error", sw, f"server_id {sid!r} repeats server_list[{ids[sid]}]; "
                                                  f"server ids must be unique"))
            else:
                ids[sid] = i
        if cards_per_node is not None and devs and len(devs) != cards_per_node:
            probs.append(Problem("error", sw, f"has {len(devs)} device(s); the recipe expects "
                                              f"cards_per_node={cards_per_node}"))
        _unique_per_server(devs, "device_id", "(HCCL reports EI0004); each physical device appears once", probs)
        _unique_per_server(devs, "host_port", "; each device on a server needs its own host_port", probs)
    return ids


def _unique_per_server(devs: list[tuple[str, Device]], field: str, why: str, probs: list[Problem]) -> None:
    seen: dict[int, int] = {}
    for j, (dw, d) in enumerate(devs):
        v = getattr(d, field)
        if v is None:
            continue
        if v in seen:
            first = devs[seen[v]][0].rsplit(".", 1)[-1].split(" ")[0]
            probs.append(Problem("error", dw, f"{field} {v} repeats {first} on this server {why}"
                                 if field == "device_id" else f"{field} {v} repeats {first}{why}"))
        else:
            seen[v] = j


def _rank_rules(p: _Parsed, probs: list[Problem]) -> None:
    """rank_id unique, exactly 0..N-1, one contiguous block per server, servers in rank order."""
    owner: dict[int, str] = {}
    blocks: list[tuple[str, list[int]]] = []
    for sw, _head, devs in p.servers:
        mine = []
        for dw, d in devs:
            if d.rank_id in owner:
                probs.append(Problem("error", dw, f"rank_id {d.rank_id} is already used by {owner[d.rank_id]}"))
            else:
                owner[d.rank_id] = dw
                mine.append(d.rank_id)
        blocks.append((sw, mine))
    if not owner:
        return
    n = p.raw_devices
    bad = sorted(r for r in owner if r >= n)
    if bad:
        probs.append(Problem("error", owner[bad[0]], f"rank_id {bad[0]} is outside 0..{n - 1} ({n} devices in the table)"))
    gaps = sorted(set(range(n)) - set(owner))
    if gaps and not bad:
        probs.append(Problem("error", "server_list", f"rank_id(s) {gaps[:8]} are missing; rank ids must be "
                                                     f"exactly 0..{n - 1}"))
    for sw, ranks in blocks:
        if ranks and sorted(ranks) != list(range(min(ranks), min(ranks) + len(ranks))):
            probs.append(Problem("error", sw, f"rank ids {sorted(ranks)} are not contiguous; each server's "
                                              f"ranks must be one block (e.g. {{0,1,2,3}},{{4,5,6,7}})"))
    starts = [(min(r), sw) for sw, r in blocks if r]
    for (a, _), (b, swb) in zip(starts, starts[1:]):
        if b < a:
            probs.append(Problem("warning", swb, f"ranks start at {b}, before the previous server's {a}; "
                                                 f"list servers in rank order"))


def _masked(field: str, value: str | None, where: str, probs: list[Problem]) -> bool:
    if value is not None and "*" in value:
        probs.append(Problem("warning", where, f"{field} {value!r} is a masked placeholder (documentation "
                                               f"sample); put the real address before use"))
        return True
    return False


def _address_rules(p: _Parsed, version: str, probs: list[Problem]) -> None:
    """host_ip IPv4; device_ip globally unique and one family; backup NIC differs from the primary."""
    owner: dict[str, str] = {}
    families: set[int] = set()
    primary: dict[str, set[int]] = {}
    for sw, head, devs in p.servers:
        if head is not None and head.host_ip and not _masked("host_ip", head.host_ip, sw, probs):
            if ipaddress.ip_address(head.host_ip).version != 4:
                probs.append(Problem("error", sw, f"host_ip {head.host_ip!r} must be IPv4"))
        for dw, d in devs:
            if d.device_ip is None or _masked("device_ip", d.device_ip, dw, probs):
                continue
            families.add(ipaddress.ip_address(d.device_ip).version)
            if d.device_ip in owner:
                probs.append(Problem("error", dw, f"device_ip {d.device_ip} is also used by {owner[d.device_ip]}; "
                                                  f"device IPs are globally unique"))
            else:
                owner[d.device_ip] = dw
            if d.device_port is not None:
                primary.setdefault(d.device_ip, set()).add(d.device_port)
    if len(families) > 1:
        probs.append(Problem("error", "server_list", "device_ip mixes IPv4 and IPv6; use one family"))
    for sw, _head, devs in p.servers:
        for dw, d in devs:
            _backup_rules(dw, d, version, primary, probs)


def _backup_rules(dw: str, d: Device, version: str, primary: dict[str, set[int]], probs: list[Problem]) -> None:
    for f in ("super_device_id", "backup_device_ip", "backup_device_port"):
        if getattr(d, f) is not None and version == "1.0":
            probs.append(Problem("warning", dw, f"{f} is a v1.2 (super pod) field; HCCL ignores it in v1.0"))
    if d.backup_device_ip is not None and d.backup_device_ip == d.device_ip:
        probs.append(Problem("error", dw, "backup_device_ip equals device_ip; the backup is the other die's NIC "
                                          "of the same NPU"))
    if d.backup_device_port is not None and d.backup_device_port <= 1023:
        probs.append(Problem("warning", dw, f"backup_device_port {d.backup_device_port} is a reserved system port "
                                            f"(1..1023); use >= 1024"))
    if (d.backup_device_ip is not None and d.backup_device_port is not None
            and d.backup_device_port in primary.get(d.backup_device_ip, set())):
        probs.append(Problem("error", dw, f"backup_device_port {d.backup_device_port} equals the primary "
                                          f"device_port of {d.backup_device_ip}; a NIC's primary and backup ports "
                                          f"must differ"))


def _port_warnings(p: _Parsed, probs: list[Problem]) -> None:
    for _sw, _head, devs in p.servers:
        for dw, d in devs:
            for f in ("device_port", "host_port"):
                v = getattr(d, f)
                if v is not None and v <= 1023:
                    probs.append(Problem("warning", dw, f"{f} {v} is a reserved system port (1..1023); use >= 1024"))


def _pod_rules(p: _Parsed, server_ids: dict[str, int], probs: list[Problem]) -> dict[str, str]:
    """Unique pod ids; each server in exactly one pod; a pod's servers listed together. Returns server -> pod."""
    pod_of: dict[str, str] = {}
    seen: set[str] = set()
    for pw, pod in p.pods or []:
        pw = f"{pw} (super_pod_id {pod.super_pod_id})"
        if pod.super_pod_id in seen:
            probs.append(Problem("error", pw, f"super_pod_id {pod.super_pod_id} is not unique"))
        seen.add(pod.super_pod_id)
        for m in pod.server_list:
            if m.server_id not in server_ids:
                probs.append(Problem("error", pw, f"server_id {m.server_id!r} is not in the top-level server_list"))
            elif m.server_id in pod_of:
                probs.append(Problem("error", pw, f"server {m.server_id} is already in super pod {pod_of[m.server_id]}"))
            else:
                pod_of[m.server_id] = pod.super_pod_id
    for sid, i in server_ids.items():
        if sid not in pod_of:
            probs.append(Problem("error", f"server_list[{i}] (server_id {sid})", "not in any super pod of super_pod_list"))
    closed: set[str] = set()
    prev = None
    for i, (_sw, head, _devs) in enumerate(p.servers):
        pid = pod_of.get(head.server_id) if head is not None else None
        if pid is None:
            continue
        if pid != prev and pid in closed:
            probs.append(Problem("error", f"server_list[{i}]", f"servers of super pod {pid} are not listed together; "
                                                               f"list each pod's servers as one block"))
        if prev is not None and pid != prev:
            closed.add(prev)
        prev = pid
    _super_device_rules(p, pod_of, probs)
    return pod_of


def _super_device_rules(p: _Parsed, pod_of: dict[str, str], probs: list[Problem]) -> None:
    seen: dict[tuple[str, int], str] = {}
    for _sw, head, devs in p.servers:
        pid = pod_of.get(head.server_id) if head is not None else None
        for dw, d in devs:
            if pid is None or d.super_device_id is None:
                continue
            key = (pid, d.super_device_id)
            if key in seen:
                probs.append(Problem("error", dw, f"super_device_id {d.super_device_id} repeats {seen[key]} in super "
                                                  f"pod {pid}"))
            else:
                seen[key] = dw


def _required_ip_rule(p: _Parsed, version: str, pod_of: dict[str, str], probs: list[Problem]) -> None:
    missing = [dw for _sw, _h, devs in p.servers for dw, d in devs if d.device_ip is None]
    multi = (len(p.servers) > 1 and version == "1.0") or (version == "1.2" and len(set(pod_of.values())) > 1)
    if multi and missing:
        what = "several servers" if version == "1.0" else "several super pods"
        probs.append(Problem("error", missing[0], f"device_ip is missing ({len(missing)} device(s)); it is "
                                                  f"required with {what} (read it from /etc/hccn.conf)"))


# ---------------------------------------------------------------------------------------------
# The check.

def check(table: dict, *, nodes: int | None = None, cards_per_node: int | None = None) -> list[Problem]:
    """Every documented rule; problems name the entry (server_list[i].device[j], server_id, rank_id).
    Raises only for a table of an unsupported format (legacy, v2.0, no version)."""
    version = version_of(table)
    probs: list[Problem] = []
    parsed = _parse_entries(table, probs)
    if parsed is None:
        _top_rules(table, version, 0, probs)
        return probs
    _top_rules(table, version, len(parsed.servers), probs)
    _string_warnings(table, probs)
    server_ids = _server_rules(parsed, cards_per_node, probs)
    _rank_rules(parsed, probs)
    _address_rules(parsed, version, probs)
    _port_warnings(parsed, probs)
    if parsed.pods is not None and version == "1.0":
        probs.append(Problem("warning", "super_pod_list", "present in a v1.0 table; set version \"1.2\" for super pods"))
    pod_of = _pod_rules(parsed, server_ids, probs) if version == "1.2" and parsed.pods is not None else {}
    _required_ip_rule(parsed, version, pod_of, probs)
    if nodes is not None and len(parsed.servers) != nodes:
        probs.append(Problem("error", "server_list", f"{len(parsed.servers)} server(s); the recipe expects nodes={nodes}"))
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


def errors_of(probs: Iterable[Problem]) -> list[Problem]:
    return [p for p in probs if p.severity == "error"]


def summary(table: dict) -> dict:
    servers = [s for s in table.get("server_list") or [] if isinstance(s, dict)]
    return {"version": str(table.get("version")), "servers": len(servers),
            "devices": sum(len(s.get("device") or []) for s in servers),
            "devices_per_server": sorted({len(s.get("device") or []) for s in servers}),
            "super_pods": len(table.get("super_pod_list") or [])}
