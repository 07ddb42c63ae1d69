"""Building rank tables: from servers and device ids (device IPs given or read from
``/etc/hccn.conf``), and by merging per-server tables. Every table is checked with
:func:`porting.cluster.ranktable.check` before it is written (atomically)."""

from __future__ import annotations

import copy
import json
import os
import re
from pathlib import Path

from model_zoo.errors import DiagnosticsError
from model_zoo.files import read_text, write_atomic
from porting.cluster.ranktable import SUPPORTED, version_of

MAX_HCCN_CONF_BYTES = 1 << 20


def parse_hccn_conf(path: str | os.PathLike) -> dict[int, str]:
    """address_<device_id>=<ip> lines of /etc/hccn.conf."""
    text = read_text(path, what="hccn.conf", max_bytes=MAX_HCCN_CONF_BYTES, error=DiagnosticsError)
    out: dict[int, str] = {}
    for line in text.splitlines():
        m = re.match(r"\s*address_(\d+)\s*=\s*(\S+)", line)
        if m:
            out[int(m.group(1))] = m.group(2)
    if not out:
        raise DiagnosticsError(f"{path}: no address_<N>=<ip> lines; expected the device NIC config of `hccn_tool`")
    return out


MAX_DEVICES_PER_SERVER = 64   # an Atlas A3 server shows 16 devices (8 chips x 2 dies); far above any real one


def parse_devices(spec: str) -> list[int]:
    """``--devices``: ``0-7`` or ``0,1,2,3`` (ranges and ids mixed), at most MAX_DEVICES_PER_SERVER."""
    out: list[int] = []
    for part in spec.split(","):
        part = part.strip()
        if not part:
            continue
        if "-" in part:
            a, b = part.split("-", 1)
            if not (a.isdigit() and b.isdigit()) or int(a) > int(b):
                raise DiagnosticsError(f"--devices: {part!r}: expected a range like 0-7")
            if int(b) - int(a) + 1 > MAX_DEVICES_PER_SERVER:
                raise DiagnosticsError(f"--devices: {part!r}: {int(b) - int(a) + 1} devices on one server; expected "
                                       f"at most {MAX_DEVICES_PER_SERVER} (an Atlas A3 server shows 16)")
            out += list(range(int(a), int(b) + 1))
        elif part.isdigit():
            out.append(int(part))
        else:
            raise DiagnosticsError(f"--devices: {part!r}: expected device ids like 0-7 or 0,1,2,3")
    if not out:
        raise DiagnosticsError("--devices: no device ids")
    if len(out) > MAX_DEVICES_PER_SERVER:
        raise DiagnosticsError(f"--devices: {len(out)} device ids on one server; expected at most "
                               f"{MAX_DEVICES_PER_SERVER}")
    return out


def servers_from_specs(servers: list[str], devices: str, device_ips: list[str] = (),
                       hccn_confs: list[str] = ()) -> list[dict]:
    """The server entries of ``port ranktable gen``: ``SERVER_ID[:HOST_IP]`` in rank order, the same device ids on
    each, device IPs from ``SERVER_ID:DEVICE_ID=IP`` specs and from ``[SERVER_ID=]PATH`` hccn.conf files."""
    dev_ids = parse_devices(devices)
    entries = []
    for s in servers:
        sid, _, host = s.partition(":")
        if not sid:
            raise DiagnosticsError(f"--server: {s!r}: expected SERVER_ID[:HOST_IP]")
        entries.append({"server_id": sid, "host_ip": host or None, "devices": [{"device_id": d} for d in dev_ids]})
    by_id = {e["server_id"]: e for e in entries}
    ips: dict[tuple[str, int], str] = {}
    for h in hccn_confs:
        sid, sep, path = h.partition("=")
        if not sep:
            if len(entries) != 1:
                raise DiagnosticsError(f"--hccn-conf: {h!r}: with several servers write SERVER_ID=PATH")
            sid, path = entries[0]["server_id"], h
        if sid not in by_id:
            raise DiagnosticsError(f"--hccn-conf: {sid!r} is not one of the --server ids {sorted(by_id)}")
        for d, ip in parse_hccn_conf(path).items():
            ips[(sid, d)] = ip
    for spec in device_ips:
        left, sep, ip = spec.partition("=")
        sid, sep2, d = left.rpartition(":")
        if not sep or not sep2 or not d.isdigit() or sid not in by_id:
            raise DiagnosticsError(f"--device-ip: {spec!r}: expected SERVER_ID:DEVICE_ID=IP with a known server id")
        ips[(sid, int(d))] = ip
    for e in entries:
        for dev in e["devices"]:
            dev["device_ip"] = ips.get((e["server_id"], dev["device_id"]))
    return entries


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


def _renumber(servers: list[dict]) -> None:
    rank = 0
    for s in servers:
        for d in s.get("device") or []:
            d["rank_id"] = str(rank)
            rank += 1


def merge(tables: list[tuple[str, dict]]) -> dict:
    """Concatenate per-server tables in the given order; rank ids renumbered 0..N-1."""
    if len(tables) < 2:
        raise DiagnosticsError("merge needs at least two rank tables")
    versions = {name: version_of(t) for name, t in tables}
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
            if not isinstance(s, dict):
                raise DiagnosticsError(f"{name}: server_list holds a {type(s).__name__}; expected objects")
            sid = str(s.get("server_id"))
            if sid in owner:
                raise DiagnosticsError(f"{name}: server_id {sid!r} is also in {owner[sid]}; each server once")
            owner[sid] = name
            servers.append(copy.deepcopy(s))
        for pod in t.get("super_pod_list") or []:
            if isinstance(pod, dict):
                pods.setdefault(str(pod.get("super_pod_id")), []).extend(pod.get("server_list") or [])
    out = {"status": "completed", "version": version, "server_count": str(len(servers)), "server_list": servers}
    if version == "1.2" and pods:
        # keep each pod's servers together: order servers by pod, stable within a pod
        pod_of = {str(m.get("server_id")): pid for pid, ms in pods.items() for m in ms if isinstance(m, dict)}
        order = list(pods)
        servers.sort(key=lambda s: order.index(pod_of.get(str(s.get("server_id")), order[-1])))
        out["super_pod_list"] = [{"super_pod_id": pid, "server_list": ms} for pid, ms in pods.items()]
    _renumber(servers)
    return out


def write_table(table: dict, out: Path) -> None:
    """Atomic write: the old file (if any) stays until the new one is complete."""
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise DiagnosticsError(f"{out}: cannot create its directory {out.parent} ({e.strerror}); choose another "
                               "--out") from None
    write_atomic(out, json.dumps(table, indent=4) + "\n", error=DiagnosticsError)
