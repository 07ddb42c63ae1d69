"""`port diverge` on real runs of the real stories260K (MindSpore PyNative and graph, the torch baseline, and under
msrun tensor parallel 2 and data parallel 2): nothing planted, nothing reported (a relaunch of one layout bitwise
equal); a planted PORT_TEST_PLANT_DIVERGENCE named exactly (step, layer, tensor, phase; a collective's bucket with
"inputs matched, outputs did not"); two data orders refused."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.helpers import port, port_process
from porting.rundir import fingerprints as fp
from tests.train.conftest import TINY, free_port

STEPS = 4
SETS = ["--set", "data.max_seq_length=64", "--set", "batching.bucketing.enabled=false",
        "--set", f"schedule.max_steps={STEPS}", "--set", "logging.fingerprint_every=1"]
TRAIN = ["--set", "checkpointing.export_hf=false", "--set", "checkpointing.every_steps=0"]
PLANT = "PORT_TEST_PLANT_DIVERGENCE"


def _train(root: Path, name: str, *extra: str, plant: str | None = None) -> Path:
    out = root / name
    p = port("train", TINY, *SETS, *TRAIN, "--set", "execution=pynative", "--set", f"output_dir={out}", *extra,
             env={PLANT: plant})
    assert p.returncode == 0, p.stderr[-3000:]
    return out


def _baseline(root: Path, name: str, *extra: str, plant: str | None = None) -> Path:
    out = root / f"{name}.json"
    p = port("baseline", "run", "--recipe", TINY, *SETS, *extra, "--out", out, env={PLANT: plant})
    assert p.returncode == 0, p.stderr[-3000:]
    return out


def _diverge(a: Path, b: Path, *extra: str) -> dict:
    p = port("diverge", a, b, "--json", *extra)
    assert p.returncode == 0, p.stderr[-2000:]
    return json.loads(p.stdout)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> Path:
    return tmp_path_factory.mktemp("diverge")


@pytest.fixture(scope="module")
def plain(root) -> Path:
    return _train(root, "plain")


@pytest.fixture(scope="module")
def baseline(root) -> Path:
    return _baseline(root, "base")


def _first(v: dict) -> tuple:
    f = v["first"]
    return f["step"], f["phase"], f["name"], f["layer"]


def test_a_relaunch_is_bitwise_equal_until_a_planted_gradient_which_is_named(root, plain):
    name = "model.layers.1.mlp.up_proj.weight"
    planted = _train(root, "planted_gradient", plant=f"3:{name}:gradient:0.01")
    v = _diverge(plain, planted)
    assert v["verdict"] == "diverged" and _first(v) == (3, "gradient", name, 1), v
    assert v["bitwise_equal_through"] == 2 and v["steps_compared"] == [1, 2, 3]
    assert v["first"]["relative"] == pytest.approx(0.0201, rel=0.05)   # (1.01)^2 - 1 on the sum of squares
    assert v["phases"] == ["forward", "gradient", "update"]
    v = _diverge(plain, plain)
    assert v["verdict"] == "bitwise_equal" and v["bitwise_equal_through"] == STEPS and v["first"] is None


def test_port_against_its_torch_baseline_nothing_planted_then_a_planted_activation(root, plain, baseline):
    v = _diverge(plain, baseline)
    assert v["verdict"] == "within_envelope" and v["first"] is None, v["first"]
    assert v["steps_compared"] == list(range(1, STEPS + 1)) and v["phases"] == ["forward", "gradient", "update"]
    assert v["bitwise_equal_through"] is None and not v["digests_compared"]   # two layouts: no bit comparison
    planted = _baseline(root, "base_forward", plant="2:model.layers.3:forward:0.01")
    v = _diverge(plain, planted, "--out", str(plain / "diverge.json"))
    assert _first(v) == (2, "forward", "model.layers.3", 3), v
    p = port("report", plain)   # the verdict beside the run's curve
    assert p.returncode == 0, p.stderr[-2000:]
    row = next(ln for ln in p.stdout.splitlines() if "diverge:" in ln)
    assert "fail" in row and "parts at step 2: forward of model.layers.3 (layer 3)" in row


@pytest.mark.graph_mode
def test_graph_mode_records_updates_and_names_a_planted_update(root, plain):
    name = "model.layers.0.self_attn.q_proj.weight"
    graph = root / "graph"
    p = port("train", TINY, *SETS, *TRAIN, "--set", f"output_dir={graph}", env={PLANT: f"2:{name}:update:-0.01"})
    assert p.returncode == 0, p.stderr[-3000:]
    v = _diverge(graph, plain)
    assert _first(v) == (2, "update", name, 0) and v["phases"] == ["update"], v


def test_two_data_orders_are_refused_with_the_reason(root, plain):
    other = _baseline(root, "base_seed1", "--set", "seed=1")
    p = port("diverge", plain, other)
    assert p.returncode != 0
    line = [ln for ln in p.stderr.splitlines() if ln.startswith("error:")]
    assert len(line) == 1 and "did not see the same batches" in line[0] and "step 1" in line[0], p.stderr


@pytest.mark.slow
def test_tensor_parallel_2_under_msrun_against_one_device(root, plain):
    """One msrun launch (2 workers, TP 2) with a planted gradient of a column-parallel weight: its slices compose
    to the one-device record (within the envelope before the plant) and the plant is named exactly."""
    name = "model.layers.2.self_attn.q_proj.weight"
    out = root / "tp2"
    p = port_process("train", TINY, *SETS, *TRAIN, "--set", "execution=pynative", "--set", f"output_dir={out}",
                     "--set", "cluster.devices_per_node=2", "--set", "parallel.tensor_parallel=2",
                     "--set", f"cluster.master_port={free_port()}", env={PLANT: f"3:{name}:gradient:0.01"},
                     timeout=240)
    assert p.returncode == 0, p.stderr[-3000:]
    assert sorted(f.name for f in (out / "fingerprints").iterdir()) == ["rank_0.jsonl", "rank_1.jsonl"]
    v = _diverge(out, plain)
    assert _first(v) == (3, "gradient", name, 2), v


def _dp2(root: Path, name: str, model_dir: Path, plant: str | None = None) -> Path:
    """One msrun launch, data parallel 2 (PyNative: port's overlapped buckets), stories260K's first layer, 3 steps,
    comm_fusion 0.1 MB: several buckets."""
    out = root / name
    p = port_process("train", TINY, *SETS, *TRAIN, "--set", "schedule.max_steps=3", "--set", "execution=pynative",
                     "--set", f"model.source={model_dir}", "--set", f"output_dir={out}",
                     "--set", "cluster.devices_per_node=2", "--set", "parallel.comm_fusion.allreduce_mode=size",
                     "--set", "parallel.comm_fusion.allreduce_config=0.1", "--set", f"cluster.master_port={free_port()}",
                     env={PLANT: plant} if plant else None, timeout=300)
    assert p.returncode == 0, p.stderr[-3000:]
    return out


@pytest.mark.slow
@pytest.mark.msrun
def test_data_parallel_2_collectives_inputs_matched_outputs_did_not(root, model_dir):
    """Three msrun launches (DP 2): clean; one bucket's all-reduce output multiplied at step 2 (named as that
    collective, "inputs matched, outputs did not"); a gradient multiplied before the all-reduce at step 2 (named as
    that gradient, the all-reduce inputs differing)."""
    clean = _dp2(root, "dp2", model_dir)
    prints = fp.read(clean / "fingerprints")
    assert len(prints.buckets) > 2 and prints.headers[0]["phases"] == ["batch", "forward", "collective", "gradient",
                                                                     "update"]
    first, last, count = prints.buckets["allreduce/bucket_1"]
    outputs = [n for n in prints.names["collective"] if n.endswith("/output")]
    assert len(outputs) == len(prints.buckets) and (1, "collective", "allreduce/bucket_1/input/dp_1") in prints.stats
    planted = _dp2(root, "dp2_collective", model_dir, plant=f"2:{first}:collective:0.01")
    v = _diverge(clean, planted, "--out", str(clean / "diverge.json"))
    assert _first(v) == (2, "collective", "allreduce/bucket_1/output", None) and v["bitwise_equal_through"] == 1, v
    c = v["first"]["collective"]
    assert (c["bucket"], c["first_tensor"], c["last_tensor"], c["tensors"]) == (1, first, last, count)
    assert c["inputs"] == "matched" and c["outputs"] == "differed"
    p = port("diverge", clean, planted)
    assert p.returncode == 0 and "step 2, collective all-reduce of gradient bucket 1" in p.stdout, p.stdout
    holds = first if count == 1 else f"{first} .. {last}, {count} tensors"
    assert f"({holds}): inputs matched, outputs did not" in p.stdout, p.stdout
    p = port("report", clean)
    row = next(ln for ln in p.stdout.splitlines() if "diverge:" in ln)
    assert "parts at step 2: collective of allreduce/bucket_1/output (inputs matched, outputs did not)" in row, row
    name = "model.layers.0.self_attn.q_proj.weight"
    before = _dp2(root, "dp2_gradient", model_dir, plant=f"2:{name}:gradient:0.01")
    v = _diverge(clean, before)
    assert _first(v) == (2, "gradient", name, 0), v
    c = v["first"]["collective"]
    assert c["side"] == "input" and c["inputs"] == "differed" and c["dp_rank"] == 0, c
