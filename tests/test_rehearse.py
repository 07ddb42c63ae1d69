"""`port rehearse`: the acceptance ladder at the recipe's shape, scaled to this machine (porting/rehearse.py).

The small model keeps the family's features; the tiny recipe's ladder passes and `port report` reads it; the
13B recipe's shape (TP 2 x DP 2, ZeRO, two node ranks on loopback) passes with every step equal across
rungs; a rung broken on purpose stops the ladder with its reason and nothing after it runs."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from model_zoo import LlamaConfig, presets
from porting.rehearse import SEQ, scaled_config, write_scaled_model
from porting.train.plan import calibrated
from tests.helpers import port, port_process
from tests.train.conftest import ROOT, error_line

TINY = str(ROOT / "recipes" / "tiny-cpu.yaml")
PHI4_MINI = ROOT / "tests" / "fixtures" / "model_configs" / "phi4_mini_instruct.json"


def _phi3_128k_style() -> dict:
    """Phi-3-mini-128k's shape (microsoft/Phi-3-mini-128k-instruct config.json: 32 heads of 96, longrope with
    48-entry lists, original context 4,096 of 131,072, pad 32000); the factors are of the same form, not its own."""
    return {"model_type": "phi3", "architectures": ["Phi3ForCausalLM"], "vocab_size": 32064, "hidden_size": 3072,
            "intermediate_size": 8192, "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": 32,
            "max_position_embeddings": 131072, "original_max_position_embeddings": 4096, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "sliding_window": 262144, "bos_token_id": 1, "eos_token_id": 32000,
            "pad_token_id": 32000, "tie_word_embeddings": False,
            "rope_scaling": {"type": "longrope", "short_factor": [1.0 + 0.002 * i for i in range(48)],
                             "long_factor": [1.0 + 1.3 * i for i in range(48)]}}


def _qwen3_yarn() -> dict:
    """Qwen3-8B with the YaRN its model card gives for long context: factor 4 over an original 32,768, while
    max_position_embeddings stays 40,960 (so the factor is not max / original)."""
    return dict(presets.config("qwen3-8b").to_hf(), rope_scaling={
        "rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768})


ROPE_FAMILIES = {"phi3-128k-style": _phi3_128k_style, "phi4-mini": lambda: json.loads(PHI4_MINI.read_text()),
                 "qwen3-8b": lambda: presets.config("qwen3-8b").to_hf(), "qwen3-8b-yarn": _qwen3_yarn}


@pytest.mark.parametrize("name", sorted(ROPE_FAMILIES))
def test_the_small_model_of_each_rope_family_matches_transformers(name, tmp_path):
    """The parity rung's check in this process, on the small model `port rehearse` writes: transformers reads its
    config.json (Phi3Config refuses factor lists of the wrong length) and port verify passes at the rungs' length,
    forward and backward. A recipe whose rows pass the original context gets a small model whose rows do too."""
    import transformers

    from porting.verify.parity import check_parity

    full = LlamaConfig.from_hf(ROPE_FAMILIES[name]())
    small = scaled_config(full, recipe_seq=8192)
    assert not small.problems() and small.partial_rotary_factor == full.partial_rotary_factor
    rs = small.rope_scaling or {}
    if rs.get("rope_type") == "longrope":
        assert len(rs["short_factor"]) == len(rs["long_factor"]) == small.rotary_dim // 2
        assert rs["original_max_position_embeddings"] < SEQ   # the recipe's 8,192 passes 4,096: so do the rungs'
        assert scaled_config(full, recipe_seq=2048).rope_scaling["original_max_position_embeddings"] > SEQ
    if name == "qwen3-8b-yarn":
        assert rs == {"rope_type": "yarn", "factor": 4.0, "original_max_position_embeddings": 32768}
    write_scaled_model(small, tmp_path / "m", seed=0)
    transformers.AutoConfig.from_pretrained(tmp_path / "m")
    report = check_parity(tmp_path / "m", batch=2, seq=SEQ, grads=True)
    assert report["seq"] == SEQ and report["passed"], report["checks"]


@pytest.mark.slow
def test_a_phi4_mini_recipe_rehearses_packed_past_its_original_context(tmp_path):
    """The real Phi-4-mini config.json (partial rotation, 48-entry longrope lists) at 8,192 tokens, packed: the
    single rung (port train on one device) compiles and trains the small model with the long factors on each
    batch's longest document. (Its parity rung's check is the test above, on the same small model.)"""
    (tmp_path / "phi4").mkdir()
    (tmp_path / "phi4" / "config.json").write_text(PHI4_MINI.read_text())
    r = port("rehearse", TINY, "--out", str(tmp_path / "r"), "--rungs", "single",
             "--set", f"model.source={tmp_path / 'phi4'}", "--set", "data.max_seq_length=8192",
             "--set", "batching.packing=true", "--set", "batching.bucketing.enabled=false")
    assert r.returncode == 0, r.stdout[-2000:] + r.stderr[-3000:]
    doc = json.loads((tmp_path / "r" / "rehearse.json").read_text())
    single = doc["rungs"][0]
    assert single["name"] == "single" and single["status"] == "pass" and len(single["losses"]) == 3, doc["rungs"]
    small = json.loads((tmp_path / "r" / "model" / "config.json").read_text())
    assert small["partial_rotary_factor"] == 0.75 and len(small["rope_scaling"]["long_factor"]) == 6
    assert small["rope_scaling"]["original_max_position_embeddings"] < 64   # the rung's rows pass it


@pytest.mark.parametrize("name", ["llama2-13b", "llama3-8b", "qwen2-7b", "llama3.2-1b"])
def test_the_small_model_keeps_the_familys_features(name):
    full = presets.config(name)
    small = scaled_config(full)
    assert not small.problems()
    full_group = full.num_attention_heads // (full.num_key_value_heads or full.num_attention_heads)
    assert small.num_attention_heads // small.num_key_value_heads == min(full_group, 4)
    assert small.num_key_value_heads % 2 == 0          # tensor parallel 2 divides the KV heads
    for keep in ("rope_theta", "rope_scaling", "tie_word_embeddings", "qkv_bias", "o_bias", "mlp_bias",
                 "rms_norm_eps", "model_type", "hidden_act"):
        assert getattr(small, keep) == getattr(full, keep), keep
    assert small.num_parameters() < 1_000_000


@pytest.mark.slow
def test_tiny_recipe_ladder_passes_and_the_report_reads_it(tmp_path):
    out = tmp_path / "r"
    # sequences of 64 (the compute rung times the recipe's own shape: half the work of the recipe's 128)
    r = port("rehearse", TINY, "--out", str(out), "--set", "data.max_seq_length=64")
    assert r.returncode == 0, r.stderr[-3000:]
    doc = json.loads((out / "rehearse.json").read_text())
    st = {g["name"]: g["status"] for g in doc["rungs"]}
    assert st == {"single": "pass", "parity": "pass", "node": "skip", "links": "skip", "compute": "pass",
                  "two-nodes": "skip"}
    # the compute rung: port's step cells at the recipe's own shapes, on its own device (porting/rehearse_compute.py):
    # one thread count (one worker), a positive time for every cell at each depth and micro-batch, the pieces
    # derived from those points, and the dry run reading the folder back. No time is compared with another (a
    # loaded machine may reorder them; speed is benchmarks/')
    cal = json.loads((out / "calibration.json").read_text())
    (t, v), = cal["by_threads"].items()
    assert int(t) == (os.cpu_count() or 1)
    at = {(p["layers"], p["micro"]): p for p in v["points"]}
    assert sorted(at) == [(1, 4), (1, 8), (4, 4), (4, 8)]
    assert all(p[f"{k}_s"] > 0 for p in at.values() for k in ("forward_backward", "update", "fused"))
    assert at[(4, 4)]["parameters"] > at[(1, 4)]["parameters"] == at[(1, 8)]["parameters"]
    derived = calibrated.derive(v["points"], cal["shape"])
    assert {k: v[k] for k in derived} == derived
    dry = port("train", TINY, "--set", "data.max_seq_length=64", "--dry-run", "--calibration", str(out))
    assert dry.returncode == 0 and "calibrated from" in dry.stdout, dry.stderr[-2000:]
    single = doc["rungs"][0]
    assert len(single["losses"]) == 3 and single["compile_s"] is not None and single["compile_s"] > 0
    rep = port("report", str(out))
    assert rep.returncode == 0, rep.stderr[-2000:]
    md = (out / "report" / "report.md").read_text()
    assert "run at 1 device" in md and "compile, rung single" in md and "rehearsal parity" in md


@pytest.mark.slow
def test_a_broken_rung_stops_the_ladder_with_its_reason(tmp_path):
    out = tmp_path / "r"
    r = port("rehearse", TINY, "--out", str(out), "--rung-set", "optimizer.lr=1e30", "--rungs", "single,parity")
    assert r.returncode != 0
    line = error_line(r)
    assert "rung single failed" in line and "loss is nan" in line
    doc = json.loads((out / "rehearse.json").read_text())
    assert [g["status"] for g in doc["rungs"]][:2] == ["fail", "not run"]


@pytest.mark.slow
@pytest.mark.msrun
def test_13b_shape_tp2_dp2_zero_two_node_ranks_pass_and_agree(tmp_path):
    out = tmp_path / "r13"
    # parity is the tiny ladder's subject (above): asked for here are the rungs of the recipe's layout
    r = port_process("rehearse", str(ROOT / "recipes" / "13b-32card.yaml"), "--out", str(out), "--rungs",
                     "single,node,links,compute,two-nodes", timeout=1800)
    assert r.returncode == 0, (r.stdout + r.stderr)[-3000:]
    doc = json.loads((out / "rehearse.json").read_text())
    rungs = {g["name"]: g for g in doc["rungs"]}
    assert all(g["status"] == "pass" for n, g in rungs.items() if n not in ("compute", "parity")), rungs
    assert rungs["parity"]["status"] == "skip", rungs
    assert rungs["compute"]["status"] == "skip" and "measured on the recipe's own device" in rungs["compute"]["detail"]
    assert rungs["node"]["layout"] == "TP 2 x DP 2 on 1 node(s)" and rungs["two-nodes"]["layout"] == "TP 2 x DP 2 on 2 node(s)"
    for name in ("node", "two-nodes"):       # each step equal to the single device's within the stated tolerance
        for a, b in zip(rungs[name]["losses"], rungs["single"]["losses"]):
            assert abs(a - b) <= doc["tolerance"]["loss_atol"]
    links = rungs["links"]["links"]   # every group's collectives timed at 4 MiB per rank, as bus bandwidth
    assert {k.split(" ")[0] for k in links["measured"]} == {"world", "tp", "dp"}, links
    assert all(v["bus_gb_s"] > 0 and v["bytes_per_rank"] == 4 << 20 for v in links["measured"].values()), links
    # and at 1 KiB, in the same launch (porting/rehearse_links.py): each collective's fixed cost
    assert all(v["latency_ms"] > 0 for v in links["measured"].values()), links
    assert rungs["links"]["command"][-1] == f"{4 << 18},256", rungs["links"]["command"]
    assert links["plan"]["tp_gb_s"] == 200.0 and "not a 910C link" in rungs["links"]["detail"]
    recipe = (out / "recipes" / "node.yaml").read_text()
    assert "optimizer_sharding: true" in recipe and "tensor_parallel: 2" in recipe
    # The two-nodes rung is `port train --launch-node N` on each node, the command a user runs on each node
    # (loopback master; one run directory, the shared filesystem of a real cluster). Its layout is the node
    # rung's, so each step equals the node rung's to 1e-6, not only the single device's tolerance.
    for a, b in zip(rungs["two-nodes"]["losses"] + rungs["two-nodes"]["grad_norms"],
                    rungs["node"]["losses"] + rungs["node"]["grad_norms"]):
        assert abs(a - b) <= 1e-6, (rungs["two-nodes"], rungs["node"])
    nodes_log = (out / "logs" / "two-nodes.log").read_text()
    assert "--node_rank=0" in nodes_log and "--node_rank=1" in nodes_log   # each launched its own node's command
    two = Path(rungs["two-nodes"]["run_dir"])
    assert {p.name for p in (two / "logs" / "msrun").glob("worker_*.log")} == {f"worker_{i}.log" for i in range(4)}
    assert {p.name for p in (two / "logs").glob("rank_*.log")} == {f"rank_{i}.log" for i in range(4)}
    md_run = port("report", str(out))
    assert md_run.returncode == 0
    md = (out / "report" / "report.md").read_text()
    for label in ("run at 1 device", "run at single-node multi-device", "run at multi-node"):
        row = next(ln for ln in md.splitlines() if label in ln)
        assert "pass" in row, row


def test_bus_bandwidth_is_nccl_tests_measure():
    from porting.rehearse_links import bus_gb_s

    # nccl-tests doc/PERFORMANCE.md: busBw = algBw x 2(n-1)/n (AllReduce), x (n-1)/n (ReduceScatter, AllGather
    # with the gathered size); 1 GB per rank in 1 s on 8 ranks
    assert bus_gb_s("AllReduce", 8, 10 ** 9, 1000.0) == pytest.approx(1.75)
    assert bus_gb_s("ReduceScatter", 8, 10 ** 9, 1000.0) == pytest.approx(0.875)
    assert bus_gb_s("AllGather", 8, 10 ** 9, 1000.0) == pytest.approx(7.0)   # 8 GB gathered
    assert bus_gb_s("AllGather (AllReduce of zero-padded)", 2, 10 ** 9, 1000.0) == pytest.approx(2.0)
    assert bus_gb_s("AllReduce", 1, 10 ** 9, 1000.0) is None and bus_gb_s("create", 4, 0, 1.0) is None


def test_compute_collectives_are_measured_when_rank_0_wrote_them_whatever_msrun_exited_with(tmp_path, monkeypatch):
    """The compute rung's collectives follow the launch's rule (porting/launch/outcome.py): rank 0 writes its points
    after the last collective every rank ran, so a worker's exit seen late by msrun's scheduler (exit 1) does not
    fail the rung; no points, or a file that does not parse, does; an earlier rehearsal's file is not read. The
    job is the one launcher's (porting/launch/jobs.py), of kind "rehearsal collectives"; its run is what msrun's
    rank 0 would leave and its exit."""
    from porting.launch.jobs import Ended, MsrunJob
    from porting.rehearse_compute import collectives
    from porting.train import load_recipe

    rec = load_recipe(TINY, ["cluster.devices_per_node=2"])
    (tmp_path / "compute").mkdir()
    res = tmp_path / "compute" / "collectives.json"
    points = {"AllReduce": {"ranks": 2, "points_bytes_ms": [[1024, 0.1]]}}

    def launch(code, writes):
        def run(job, timeout_s=None, output=None):
            assert job.kind == "rehearsal collectives" and job.spec.script.name == "collectives.py"
            assert not res.exists()
            if writes is not None:
                res.write_text(writes, encoding="utf-8")
            return Ended(code, 0.0)
        monkeypatch.setattr(MsrunJob, "run", run)

    launch(0, json.dumps(points))
    assert collectives(rec, tmp_path, 60) == ("pass", "", {**points, "extrapolated": []})
    launch(1, json.dumps(points))
    assert collectives(rec, tmp_path, 60) == ("pass", "msrun exit 1 after rank 0 wrote every measurement",
                                              {**points, "extrapolated": []})
    res.write_text(json.dumps(points), encoding="utf-8")   # an earlier rehearsal's
    launch(1, None)
    assert collectives(rec, tmp_path, 60) == ("fail", "collectives under msrun: exit 1", {})
    launch(None, '{"AllReduce": ')
    assert collectives(rec, tmp_path, 60) == ("fail", "collectives under msrun: timed out", {})


@pytest.mark.slow
@pytest.mark.msrun
def test_the_compute_rungs_collectives_time_every_kind_on_every_group_size_the_node_holds(tmp_path):
    """4 real msrun workers (a tiny recipe's node of 4): groups of 2 and 4, each kind as port runs it on the CPU
    (ReduceScatter as AllReduce + slice, a sub-group's AllGather as an AllReduce of zero-padded shards, the world's
    AllGather native), quick sizes; then a ZeRO plan of that node prices its gradient reduce-scatter from them and
    names the emulation, and the synchronisation chain times each group size (one launch: the rung's own collectives
    job, porting/rehearse_compute.py)."""
    from porting.rehearse_compute import collectives, group_sizes
    from porting.train import load_recipe, plan_config
    from porting.train.plan import comm_price, sharding
    from tests.train.conftest import free_port

    rec = load_recipe(TINY, ["cluster.devices_per_node=4", "parallel.optimizer_sharding=true",
                             "data.max_seq_length=64", f"cluster.master_port={free_port()}"], check_files=False)
    cfg, _ = plan_config(rec)
    assert group_sizes(rec, cfg) == ([2, 4], [])
    (tmp_path / "compute").mkdir()
    status, note, doc = collectives(rec, tmp_path, 600, cfg, elements=(256, 1 << 14), repeats=2,
                                    chunks=((128, 128), (256, 128)), sync_calls=4)   # a quick chain
    assert status == "pass", note
    m = doc["measured"]
    assert sorted(m) == sorted(f"{k}@{n}" for k in ("AllReduce", "ReduceScatter", "AllGather") for n in (2, 4))
    assert {k: v["runs"] for k, v in m.items() if v["emulated"]} == {
        "ReduceScatter@2": "AllReduce + slice", "ReduceScatter@4": "AllReduce + slice",
        "AllGather@2": "AllReduce of zero-padded"}
    assert m["AllGather@4"]["runs"] == "AllGather"   # the world group's own
    assert all(len(v["points_bytes_ms"]) == 2 and all(t > 0 for _, t in v["points_bytes_ms"]) for v in m.values())
    assert [b for b, _ in m["AllGather@2"]["points_bytes_ms"]] == [1024, 65536]   # payload: the gathered buffer
    # the synchronisation chain on the same groups: every rank computing, with a 1 KiB AllReduce after each chunk,
    # and rank 0 alone; the plan reads a compute factor and a wait per call from them (comm_price.contention)
    assert sorted(doc["contention"]) == ["2", "4"] and doc["workers"] == 4
    for g in doc["contention"].values():
        assert [(c["rows"], c["width"], c["calls"], c["payload_bytes"]) for c in g["chunks"]] == [
            (128, 128, 4, 1024), (256, 128, 4, 1024)]
        assert all(c["alone_ms"] > 0 and c["together_ms"] > 0 and c["with_ms"] > 0 for c in g["chunks"])
    cont = comm_price.contention({"collectives": doc})
    assert cont is not None and cont.workers == 4 and cont.compute_factor > 0 and sorted(cont.waits) == [2, 4]
    grads = next(c for c in sharding.collectives(rec, cfg) if "flat buckets" in c.purpose)
    f = comm_price.price(grads, {"collectives": doc}, {}, native_rs=False, nodes=1, peak=None)
    assert f.basis == "measured" and "ReduceScatter as port runs it there: AllReduce + slice, emulated" in f.figure
