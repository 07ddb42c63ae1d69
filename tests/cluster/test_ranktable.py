"""`port ranktable` on the real tables in ../shared (incl. the invalid EI0004 one) and on one
mutation per documented rule."""

from __future__ import annotations

import copy
import json
import subprocess
import sys
from pathlib import Path

import pytest

from porting.diagnostics import DiagnosticsError
from porting.cluster import generate as gen
from porting.cluster import ranktable as rt
from tests.conftest import SHARED, WRITTEN_FOR, rank_table_params

ROOT = Path(__file__).resolve().parents[2]


def cli(*args: str):
    """In-process through click (a subprocess costs ~2 s of imports per call); see test_cli_subprocess."""
    from click.testing import CliRunner

    from porting.cli import main

    r = CliRunner().invoke(main, ["ranktable", *args])
    r.returncode = r.exit_code
    return r


def test_cli_subprocess_one_line_error(shared):
    path = shared / "data/ascend/rank_tables/mindspore_docs_EI0004_invalid_ranktable_duplicate_device_id.json"
    r = subprocess.run([sys.executable, "-m", "porting", "ranktable", "check", str(path)], cwd=ROOT,
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 1 and r.stderr.startswith("error: ") and len(r.stderr.strip().splitlines()) == 1


EXPECTED = {  # file -> "ok" | "warnings" | substring of the first error | ("unsupported", substring)
    "hccl_cann85_guide_A3_v1.2_2servers_2dev.json": "ok",
    "hiascend_hcclug_A2_v1.0_2servers_2dev.json": "ok",
    "rank_table_config_300i_duo_0_v1.0.json": "ok",
    "rank_table_config_910_0_v1.0.json": "ok",
    "rank_table_config_a2_0_v1.0.json": "ok",
    "rank_table_config_a3_0_v1.2.json": "ok",
    "rank_table_config_a3_1_v1.0.json": "ok",
    "mindspore_docs_rank_table_8pcs.json": "warnings",
    "mindspore_docs_rank_table_16pcs.json": "warnings",
    "mindspore_docs_EI0004_invalid_ranktable_duplicate_device_id.json": "device_id 1 repeats device[0]",
    "rank_table_config_910_1_v?.json": ("unsupported", "legacy rank table format"),
    "rank_table_config_a5_0_v2.0.json": ("unsupported", "version '2.0'"),
    "rank_table_config_a5_1_v2.0.json": ("unsupported", "version '2.0'"),
    "rank_table_config_a5_2_v2.0.json": ("unsupported", "version '2.0'"),
}


def test_every_shared_table_is_covered(shared):
    names = {p.name for p in (shared / "data/ascend/rank_tables").iterdir()}
    # without ../shared: the shipped real tables, and a written equivalent for each one port may not ship
    assert names == set(EXPECTED) if SHARED.is_dir() else (names | set(WRITTEN_FOR) == set(EXPECTED))


@pytest.mark.parametrize("name,path", [pytest.param(n, *p.values, id=p.id) for n in sorted(EXPECTED)
                                       for p in rank_table_params(n)])
def test_shared_tables(name, path):
    want = EXPECTED[name]
    if isinstance(want, tuple):
        with pytest.raises(DiagnosticsError, match=want[1].replace("?", r"\?").replace("(", r"\(")):
            rt.check(rt.load(path))
        r = cli("check", str(path))
        assert r.returncode == 2 and r.stderr.startswith("error: ") and "Traceback" not in r.stderr
        return
    probs = rt.check(rt.load(path))
    errs = rt.errors_of(probs)
    if want == "ok":
        assert probs == []
        assert cli("check", str(path)).returncode == 0
    elif want == "warnings":
        assert errs == [] and probs and all(p.severity == "warning" for p in probs)
    else:
        assert len(errs) == 1 and want in errs[0].message
        assert "server_list[0]" in errs[0].where and "device[1]" in errs[0].where and "rank_id 1" in errs[0].where
        r = cli("check", str(path), "--json")
        assert r.returncode == 1
        out = json.loads(r.stdout)
        assert out["ok"] is False and [p for p in out["problems"] if p["severity"] == "error"]
        assert r.stderr.startswith("error: ") and "EI0004" in r.stderr


def base12() -> dict:
    servers = [{"server_id": f"node_{s}", "host_ip": f"172.16.0.{10 + s}",
                "devices": [{"device_id": d, "device_ip": f"192.168.{s}.{10 + d}"} for d in range(4)]}
               for s in range(4)]
    t = gen.generate(servers, version="1.2", super_pod_size=2)
    for s in t["server_list"]:
        for d in s["device"]:
            d["device_port"] = "16666"
            d["host_port"] = str(16600 + int(d["device_id"]))
    assert rt.check(t) == []
    return t


def dev(t: dict, s: int, d: int) -> dict:
    return t["server_list"][s]["device"][d]


def mutate_interleaved_ranks(t):
    # {0,1,2,7},{3,4,5,6}: the guide's counter-example
    for i, r in enumerate([0, 1, 2, 7]):
        dev(t, 0, i)["rank_id"] = str(r)
    for i, r in enumerate([3, 4, 5, 6]):
        dev(t, 1, i)["rank_id"] = str(r)


def mutate_pods_interleaved(t):
    t["super_pod_list"][0]["server_list"] = [{"server_id": "node_0"}, {"server_id": "node_2"}]
    t["super_pod_list"][1]["server_list"] = [{"server_id": "node_1"}, {"server_id": "node_3"}]


RULES = [
    ("status initializing", lambda t: t.update(status="initializing"), "status", "completed"),
    ("server_count mismatch", lambda t: t.update(server_count="3"), "server_count", "4 server(s)"),
    ("duplicate server_id", lambda t: t["server_list"][1].update(server_id="node_0"), "server_list[1]", "unique"),
    ("long server_id", lambda t: t["server_list"][2].update(server_id="n" * 65), "server_list[2]", "at most 64"),
    ("duplicate device_id", lambda t: dev(t, 1, 2).update(device_id="1"), "device[2]", "repeats device[1]"),
    ("duplicate rank_id", lambda t: dev(t, 3, 3).update(rank_id="0"), "server_list[3]", "already used"),
    ("rank out of range", lambda t: dev(t, 3, 3).update(rank_id="99"), "rank_id 99", "outside 0..15"),
    ("interleaved ranks", mutate_interleaved_ranks, "server_list[0]", "not contiguous"),
    ("bad device_ip", lambda t: dev(t, 0, 1).update(device_ip="192.168.300.1"), "device[1]", "not an IPv4/IPv6"),
    ("duplicate device_ip", lambda t: dev(t, 1, 0).update(device_ip="192.168.0.10"), "server_list[1]",
     "globally unique"),
    ("mixed ip families", lambda t: dev(t, 2, 0).update(device_ip="fe80::1"), "server_list", "IPv4 and IPv6"),
    ("port out of range", lambda t: dev(t, 0, 0).update(device_port="70000"), "device[0]", "1..65535"),
    ("duplicate host_port", lambda t: dev(t, 0, 3).update(host_port="16600"), "device[3]", "own host_port"),
    ("bad host_ip", lambda t: t["server_list"][0].update(host_ip="fe80::2"), "server_list[0]", "must be IPv4"),
    ("pod names unknown server", lambda t: t["super_pod_list"][1]["server_list"].append({"server_id": "ghost"}),
     "super_pod_list[1]", "'ghost' is not in the top-level"),
    ("server in two pods", lambda t: t["super_pod_list"][1]["server_list"].append({"server_id": "node_0"}),
     "super_pod_list[1]", "already in super pod 0"),
    ("server in no pod", lambda t: t["super_pod_list"][1]["server_list"].pop(), "server_id node_3",
     "not in any super pod"),
    ("pods interleaved", mutate_pods_interleaved, "server_list[2]", "not listed together"),
    ("duplicate super_device_id", lambda t: dev(t, 1, 0).update(super_device_id="0"), "server_list[1]",
     "super_device_id 0 repeats"),
    ("duplicate super_pod_id", lambda t: t["super_pod_list"][1].update(super_pod_id="0"), "super_pod_list[1]",
     "not unique"),
    ("backup port equals primary", lambda t: (dev(t, 0, 0).update(backup_device_ip="192.168.0.11",
                                                                backup_device_port="16666")),
     "device[0]", "primary and backup ports must differ"),
    ("backup ip equals own ip", lambda t: dev(t, 0, 0).update(backup_device_ip="192.168.0.10"), "device[0]",
     "backup_device_ip equals device_ip"),
    ("missing device_ip across pods", lambda t: dev(t, 3, 1).pop("device_ip"), "server_list[3]", "required"),
    ("missing rank_id", lambda t: dev(t, 2, 2).pop("rank_id"), "server_list[2]", "rank_id is missing"),
]


@pytest.mark.parametrize("label,mutate,where,msg", RULES, ids=[r[0] for r in RULES])
def test_each_documented_rule_names_the_entry(label, mutate, where, msg):
    t = copy.deepcopy(base12())
    mutate(t)
    errs = rt.errors_of(rt.check(t))
    hit = [e for e in errs if where in e.where and msg in e.message]
    assert hit, f"{label}: no error with {where!r}/{msg!r} in {[str(e) for e in errs]}"


def test_reserved_port_is_a_warning_and_v12_fields_in_v10_warn():
    t = base12()
    dev(t, 0, 0)["device_port"] = "80"
    probs = rt.check(t)
    assert [p.severity for p in probs] == ["warning"] and "reserved" in probs[0].message
    t10 = base12()
    t10["version"] = "1.0"
    probs10 = rt.check(t10)
    assert rt.errors_of(probs10) == []
    assert any("v1.2 (super pod) field" in p.message for p in probs10)
    assert any(p.where == "super_pod_list" and "version \"1.2\"" in p.message for p in probs10)


@pytest.mark.parametrize("table", rank_table_params("rank_table_config_a3_0_v1.2.json"))  # 4 servers x 4 devices
def test_recipe_cluster_comparison(tmp_path, table):
    assert cli("check", str(table), "--nodes", "4", "--cards-per-node", "4").returncode == 0
    r = cli("check", str(table), "--nodes", "2", "--cards-per-node", "16")
    assert r.returncode == 1 and "nodes=2" in r.stdout and "cards_per_node=16" in r.stdout
    # the recipe is read by `port train`'s strict loader: the same file `port train` would run
    recipe = tmp_path / "r.yaml"
    recipe.write_text("model:\n  source: stories260k\ndata:\n  path: d.txt\n"
                      "cluster:\n  device: ascend\n  nodes: 4\n  devices_per_node: 16\n")
    r = cli("check", str(table), "--recipe", str(recipe))
    assert r.returncode == 1 and "has 4 device(s); the recipe expects cards_per_node=16" in r.stdout
    recipe.write_text("model:\n  source: stories260k\ndata:\n  path: d.txt\ncluster:\n  nodes: 4\n"
                      "  devices_per_node: 4\n")
    assert cli("check", str(table), "--recipe", str(recipe)).returncode == 0
    # the key the old lenient reader accepted is refused, as `port train` refuses it
    recipe.write_text("model:\n  source: stories260k\ndata:\n  path: d.txt\ncluster:\n  nodes: 4\n"
                      "  cards_per_node: 16\n")
    r = cli("check", str(table), "--recipe", str(recipe))
    assert r.returncode == 2 and "cluster.cards_per_node: unknown key" in r.stderr
    recipe.write_text("model:\n  source: stories260k\ndata:\n  path: d.txt\ncluster:\n  nodes: two\n")
    r = cli("check", str(table), "--recipe", str(recipe))
    assert r.returncode == 2 and "cluster.nodes" in r.stderr and "'two'" in r.stderr


def test_example_recipe_in_help_exists():
    from porting.train.recipe.schema import load_recipe

    helptext = cli("--help").stdout
    for word in helptext.split():
        if word.startswith("recipes/"):
            assert load_recipe(ROOT / word, check_files=False).cluster.nodes >= 1


def test_gen_from_hccn_conf_and_merge(tmp_path):
    conf0, conf1 = tmp_path / "hccn0.conf", tmp_path / "hccn1.conf"
    conf0.write_text("".join(f"address_{d}=192.168.1.{d + 1}\nnetmask_{d}=255.255.255.0\n" for d in range(8)))
    conf1.write_text("".join(f"address_{d}=192.168.2.{d + 1}\n" for d in range(8)))
    out0, out1 = tmp_path / "n0.json", tmp_path / "n1.json"
    r = cli("gen", "--server", "node_0:10.0.0.1", "--devices", "0-7", "--hccn-conf", str(conf0), "--out", str(out0))
    assert r.returncode == 0, r.stderr
    r = cli("gen", "--server", "node_1:10.0.0.2", "--devices", "0-7", "--hccn-conf", str(conf1), "--out", str(out1))
    assert r.returncode == 0, r.stderr
    t0 = json.loads(out0.read_text())
    assert t0["version"] == "1.0" and dev(t0, 0, 3)["device_ip"] == "192.168.1.4" and dev(t0, 0, 7)["rank_id"] == "7"
    merged = tmp_path / "merged.json"
    r = cli("merge", str(out0), str(out1), "--out", str(merged))
    assert r.returncode == 0, r.stderr
    m = json.loads(merged.read_text())
    assert m["server_count"] == "2" and [d["rank_id"] for d in m["server_list"][1]["device"]] == [str(i) for i in range(8, 16)]
    assert rt.check(m) == []
    # merging a server twice is refused and writes nothing
    bad = tmp_path / "bad.json"
    r = cli("merge", str(out0), str(out0), "--out", str(bad))
    assert r.returncode == 2 and "server_id 'node_0' is also in" in r.stderr and not bad.exists()


def test_gen_v12_super_pods_and_refusals(tmp_path):
    out = tmp_path / "a3.json"
    args = ["gen", "--version", "1.2", "--super-pod-size", "2", "--devices", "0-15"]
    for s in range(4):
        args += ["--server", f"n{s}"]
        args += [f"--device-ip=n{s}:{d}=10.{s}.0.{d + 1}" for d in range(16)]
    r = cli(*args, "--out", str(out))
    assert r.returncode == 0, r.stderr
    t = json.loads(out.read_text())
    assert len(t["super_pod_list"]) == 2 and rt.check(t) == []
    # two super pods without device IPs: invalid, nothing written
    out2 = tmp_path / "noip.json"
    r = cli("gen", "--version", "1.2", "--super-pod-size", "1", "--server", "a", "--server", "b", "--devices", "0-1",
            "--out", str(out2))
    assert r.returncode == 2 and "device_ip is missing" in r.stderr and not out2.exists()
    r = cli("gen", "--server", "a", "--devices", "0-x", "--out", str(out2))
    assert r.returncode == 2 and "0-x" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("content,needle", [
    ('{"version": "1.0", // comment\n "status": "completed"}', "comments are not allowed"),
    ("[1, 2]", "expected a JSON object"),
    (b"\xff\xfe\x00garbage", "not valid UTF-8"),
    ("[" * 100_000 + "]" * 100_000, "nests deeper than"),
    ('{"status": "completed"}', "no 'version'"),
    ('{"version": "1.0", "status": "completed", "server_count": "1"', "invalid rank table JSON at line 1 column 62"),
])
def test_malformed_tables_one_line_error(tmp_path, content, needle):
    p = tmp_path / "rt.json"
    p.write_bytes(content if isinstance(content, bytes) else content.encode())
    r = cli("check", str(p))
    assert r.returncode == 2 and r.stderr.startswith("error: ") and needle in r.stderr
    assert len(r.stderr.strip().splitlines()) == 1
    r = cli("check", str(tmp_path / "missing.json"))
    assert r.returncode == 2 and "no such rank table file" in r.stderr


def test_help_has_examples():
    for sub in ((), ("check",), ("gen",), ("merge",)):
        assert "Examples:" in cli(*sub, "--help").stdout


@pytest.mark.parametrize("path", rank_table_params("hiascend_hcclug_A2_v1.0_2servers_2dev.json"))
def test_typed_table_and_peer_addresses(path):
    table = rt.parse(rt.load(path))
    assert isinstance(table, rt.RankTable) and table.world_size == 4
    ips = table.rank_of_ip()
    assert sorted(ips.values())[:1] == [0] and len({v for v in ips.values()}) == 4
    assert all(isinstance(d.rank_id, int) for s in table.server_list for d in s.device)
    bad = base12()
    dev(bad, 0, 0)["rank_id"] = "x"
    with pytest.raises(DiagnosticsError, match="rank_id 'x' is not a non-negative integer"):
        rt.parse(bad)


def test_several_bad_entries_are_reported_together():
    t = base12()
    dev(t, 0, 0)["device_port"] = "70000"     # a field error in one device ...
    dev(t, 1, 0)["device_id"] = "1"           # ... does not hide a rule broken elsewhere
    t["server_list"][2]["server_id"] = "node_0"
    msgs = [str(p) for p in rt.errors_of(rt.check(t))]
    assert any("device_port '70000' must be an integer in 1..65535" in m for m in msgs)
    assert any("server_list[1]" in m and "device_id 1 repeats device[0]" in m for m in msgs)
    assert any("server_id 'node_0' repeats server_list[0]" in m for m in msgs)
