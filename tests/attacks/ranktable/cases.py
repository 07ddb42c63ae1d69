"""`port ranktable`: hostile rank tables and hccn.conf files are one line, never a traceback."""

from __future__ import annotations

import json
from pathlib import Path

from tests.attacks import inputs as I
from tests.attacks.harness import case


def _table(d: Path, raw: str | bytes, name: str = "rank_table.json") -> Path:
    p = d / name
    p.write_bytes(raw.encode() if isinstance(raw, str) else raw)
    return p


GOOD = {"version": "1.0", "server_count": "1", "status": "completed", "server_list": [
    {"server_id": "node_0", "device": [{"device_id": "0", "device_ip": "192.168.1.8", "rank_id": "0"}]}]}


@case("rank_table.json", dest=None)
def check_nested_100000_levels(d):
    return ["ranktable", "check", str(_table(d, I.deep_object()))]


@case("rank_table.json", dest=None)
def check_not_utf8(d):
    return ["ranktable", "check", str(_table(d, I.NOT_UTF8))]


@case("rank_table.json", dest=None)
def check_is_a_list(d):
    return ["ranktable", "check", str(_table(d, "[1]"))]


@case("rank_table.json", dest=None)
def check_truncated(d):
    return ["ranktable", "check", str(_table(d, json.dumps(GOOD)[:40]))]


@case("rank_table.json", dest=None)
def check_missing(d):
    return ["ranktable", "check", str(d / "rank_table.json")]


@case("rank_table.json", dest=None, timeout=10)
def check_is_a_fifo(d):
    import os

    os.mkfifo(d / "rank_table.json")
    return ["ranktable", "check", str(d / "rank_table.json")]


@case("rank_table.json", dest=None)
def check_of_100_mb(d):
    return ["ranktable", "check", str(I.big_sparse(d / "rank_table.json", 100 << 20))]


@case(dest=None)
def check_recipe_alias_bomb(d):
    lines = ['a0: &a0 ["lol","lol","lol","lol","lol","lol","lol","lol","lol"]']
    lines += [f"a{i}: &a{i} [" + ",".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 10)]
    return ["ranktable", "check", str(_table(d, json.dumps(GOOD))), "--recipe",
            str(I.recipe_text(d, "\n".join(lines) + "\n"))]


@case("a.json", dest=None)
def merge_nested(d):
    return ["ranktable", "merge", str(_table(d, I.deep_json(), "a.json")), str(_table(d, json.dumps(GOOD), "b.json")),
            "--out", str(d / "out.json")]


@case("a.json", dest=None)
def merge_not_utf8(d):
    return ["ranktable", "merge", str(_table(d, I.NOT_UTF8, "a.json")), str(_table(d, json.dumps(GOOD), "b.json")),
            "--out", str(d / "out.json")]


@case("hccn.conf", dest=None)
def gen_hccn_conf_not_utf8(d):
    (d / "hccn.conf").write_bytes(I.NOT_UTF8)
    return ["ranktable", "gen", "--server", "node_0", "--devices", "0-7", "--hccn-conf", f"node_0={d / 'hccn.conf'}",
            "--out", str(d / "rt.json")]


@case(dest=None, timeout=10)
def gen_devices_huge_range(d):
    return ["ranktable", "gen", "--server", "node_0", "--devices", "0-100000000", "--out", str(d / "rt.json")]


@case(dest=None)
def gen_out_under_proc(d):
    return ["ranktable", "gen", "--server", "node_0:10.0.0.1", "--devices", "0-1",
            "--device-ip", "node_0:0=192.168.1.8", "--device-ip", "node_0:1=192.168.1.9",
            "--out", "/proc/port-attack/rt.json"]


# -- --out under the converters' rule
@case("a.json", "overlaps the input", dest=None)
def merge_out_is_one_of_its_inputs(d):
    """`merge a.json b.json --out a.json` replaced an input with the merge."""
    return ["ranktable", "merge", str(_table(d, json.dumps(GOOD), "a.json")), str(_table(d, json.dumps(GOOD), "b.json")),
            "--out", str(d / "a.json")]


@case("rank_table.json", "exists and is not a rank table", dest=None)
def gen_out_over_an_existing_table(d):
    I.canary(d, "rank_table.json")
    return ["ranktable", "gen", "--server", "node_0:10.0.0.1", "--devices", "0-1",
            "--device-ip", "node_0:0=192.168.1.8", "--device-ip", "node_0:1=192.168.1.9",
            "--out", str(d / "rank_table.json")]
