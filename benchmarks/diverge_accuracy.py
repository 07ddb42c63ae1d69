"""`port diverge`'s planted-case accuracy: 20 planted divergences across four pairings, and each pairing with nothing
planted over a longer run.

Every run is the real stories260K on recipes/tiny-cpu.yaml (``data.max_seq_length`` 64, one padded shape,
``logging.fingerprint_every`` 1). A case launches one run with ``PORT_TEST_PLANT_DIVERGENCE=STEP:TENSOR:PHASE:REL``
and asks ``port diverge`` against the pairing's clean reference; a hit is the planted step, tensor (HF name) and
phase named exactly as the first divergence. Pairings:

- ``torch``: port (PyNative, 1 device) against its PyTorch baseline (`port baseline run`), planted on either side;
- ``graph``: a graph-mode run (updates only are observable there) against the PyNative run;
- ``tp2``: tensor parallel 2 under msrun (2 CPU workers, PyNative) against the 1-device PyNative run;
- ``zero``: data parallel 2 with optimizer sharding (ZeRO 1, no gradient records) against data parallel 2 without.

The clean check: each pairing's two sides with nothing planted for ``--clean-steps`` steps must give no divergence
(and the same-layout relaunch, PyNative 1 device twice, "bitwise equal").

    python benchmarks/diverge_accuracy.py                       # 20 cases (12 steps) + clean checks (50 steps)
    python benchmarks/diverge_accuracy.py --pairings torch,graph --clean-steps 20 --json acc.json
    python benchmarks/diverge_accuracy.py --scale 0.1 --clean-steps 0   # the same cases at a tenth (1e-3)
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "tiny-cpu.yaml"
L = "model.layers"
# (pairing, planted side: "a" the run under test / "b" the reference, step, tensor, phase, relative)
CASES = [
    ("torch", "a", 3, f"{L}.1.mlp.up_proj.weight", "gradient", 0.01),
    ("torch", "b", 5, f"{L}.4", "forward", 0.01),
    ("torch", "a", 7, f"{L}.2.self_attn.v_proj.weight", "update", 0.01),
    ("torch", "b", 9, f"{L}.0.post_attention_layernorm.weight", "gradient", 0.01),
    ("torch", "a", 11, f"{L}.3", "forward", -0.01),
    ("graph", "a", 2, f"{L}.0.self_attn.q_proj.weight", "update", 0.01),
    ("graph", "a", 4, f"{L}.1.mlp.down_proj.weight", "update", 0.01),
    ("graph", "a", 6, f"{L}.2.input_layernorm.weight", "update", -0.01),
    ("graph", "a", 8, "model.norm.weight", "update", 0.01),
    ("graph", "a", 10, "model.embed_tokens.weight", "update", 0.01),
    ("tp2", "a", 2, f"{L}.0.self_attn.k_proj.weight", "gradient", 0.01),
    ("tp2", "a", 4, f"{L}.3", "forward", 0.01),
    ("tp2", "a", 6, f"{L}.1.mlp.gate_proj.weight", "update", 0.01),
    ("tp2", "a", 8, f"{L}.4.self_attn.o_proj.weight", "gradient", -0.01),
    ("tp2", "a", 10, "model.norm.weight", "gradient", 0.01),
    ("zero", "a", 3, f"{L}.2", "forward", 0.01),
    ("zero", "a", 5, f"{L}.1.mlp.down_proj.weight", "update", 0.01),
    ("zero", "a", 7, f"{L}.0", "forward", -0.01),
    ("zero", "a", 9, f"{L}.4.self_attn.q_proj.weight", "update", 0.01),
    ("zero", "a", 11, "model.embed_tokens.weight", "update", 0.01),
]
ONE = ["execution=pynative"]
SIDES = {   # pairing -> (the run under test, the reference): each a kind and its --set values
    "torch": (("train", ONE), ("baseline", [])),
    "graph": (("train", ["execution=graph"]), ("train", ONE)),
    "tp2": (("train", ONE + ["cluster.devices_per_node=2", "parallel.tensor_parallel=2"]), ("train", ONE)),
    "zero": (("train", ONE + ["cluster.devices_per_node=2", "batching.micro_batch_size=2",
                              "parallel.optimizer_sharding=true"]),
             ("train", ONE + ["cluster.devices_per_node=2", "batching.micro_batch_size=2"])),
}


def _port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(kind: str, sets: list[str], steps: int, out: Path, plant: str | None = None) -> Path:
    """One `port train` (a run directory) or `port baseline run` (a baseline file) with fingerprints every step."""
    common = ["data.max_seq_length=64", "batching.bucketing.enabled=false", f"schedule.max_steps={steps}",
              "schedule.epochs=20", "logging.fingerprint_every=1", *sets]
    if kind == "train":
        argv = ["train", str(RECIPE), "--set", f"output_dir={out}", "--set", "checkpointing.export_hf=false",
                "--set", "checkpointing.every_steps=0", "--set", f"cluster.master_port={_port()}"]
    else:
        out = out.with_suffix(".json")
        argv = ["baseline", "run", "--recipe", str(RECIPE), "--out", str(out)]
    for s in common:
        argv += ["--set", s]
    env = {**os.environ, "GLOG_v": "3"}
    env.pop("PORT_TEST_PLANT_DIVERGENCE", None)
    if plant:
        env["PORT_TEST_PLANT_DIVERGENCE"] = plant
    p = subprocess.run([sys.executable, "-m", "porting", *argv], capture_output=True, text=True, env=env, timeout=900)
    if p.returncode:
        raise SystemExit(f"{kind} {sets} {plant}: failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return out


def diverge(a: Path, b: Path) -> dict:
    p = subprocess.run([sys.executable, "-m", "porting", "diverge", str(a), str(b), "--json"], capture_output=True,
                       text=True, timeout=300)
    if p.returncode:
        raise SystemExit(f"port diverge {a} {b}: {p.stderr[-2000:]}")
    return json.loads(p.stdout)


def planted(pairings: list[str], steps: int, work: Path, scale: float = 1.0) -> list[dict]:
    refs: dict[tuple, Path] = {}

    def ref(pairing: str, side: int) -> Path:
        kind, sets = SIDES[pairing][side]
        key = (kind, tuple(sets))
        if key not in refs:
            refs[key] = launch(kind, sets, steps, work / f"ref-{len(refs)}")
        return refs[key]

    rows = []
    for i, (pairing, side, step, name, phase, rel) in enumerate(c for c in CASES if c[0] in pairings):
        t0, rel = time.perf_counter(), rel * scale
        idx = 0 if side == "a" else 1
        kind, sets = SIDES[pairing][idx]
        run = launch(kind, sets, steps, work / f"case-{i}", plant=f"{step}:{name}:{phase}:{rel}")
        other = ref(pairing, 1 - idx)
        v = diverge(run, other)
        f = v["first"] or {}
        got = (f.get("step"), f.get("name"), f.get("phase"))
        rows.append({"pairing": pairing, "planted": [step, name, phase, rel], "named": list(got),
                     "hit": got == (step, name, phase), "relative": f.get("relative"),
                     "tolerance": f.get("tolerance"), "wall_s": round(time.perf_counter() - t0, 1)})
        print(json.dumps(rows[-1]), flush=True)
    return rows


def clean(pairings: list[str], steps: int, work: Path) -> dict:
    out = {}
    for pairing in pairings:
        a = launch(*SIDES[pairing][0], steps, work / f"clean-{pairing}-a")
        b = launch(*SIDES[pairing][1], steps, work / f"clean-{pairing}-b")
        v = diverge(a, b)
        out[pairing] = {"verdict": v["verdict"], "first": v["first"], "steps": len(v["steps_compared"])}
        if pairing == "graph":   # the PyNative side launched again: the same layout, bit for bit
            again = launch(*SIDES[pairing][1], steps, work / "clean-relaunch")
            w = diverge(b, again)
            out["relaunch"] = {"verdict": w["verdict"], "bitwise_equal_through": w["bitwise_equal_through"]}
        print(json.dumps({pairing: out[pairing]}), flush=True)
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--pairings", default="torch,graph,tp2,zero")
    ap.add_argument("--steps", type=int, default=12, help="steps of each planted case and its reference")
    ap.add_argument("--clean-steps", type=int, default=50, help="steps of the nothing-planted check (0: skip)")
    ap.add_argument("--scale", type=float, default=1.0, help="every case's relative perturbation times this")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    pairings = a.pairings.split(",")
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="port-diverge-") as tmp:
        rows = planted(pairings, a.steps, Path(tmp), a.scale)
        nothing = clean(pairings, a.clean_steps, Path(tmp)) if a.clean_steps else {}
    hits = sum(r["hit"] for r in rows)
    out = {"cpu": _cpu(), "scale": a.scale, "hits": hits, "cases": len(rows), "by_pairing": {
        p: f"{sum(r['hit'] for r in rows if r['pairing'] == p)}/{sum(r['pairing'] == p for r in rows)}"
        for p in pairings}, "clean": nothing, "rows": rows, "wall_s": round(time.perf_counter() - t0, 1)}
    print(json.dumps({k: v for k, v in out.items() if k != "rows"}, indent=1))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


def _cpu() -> str:
    sys.path.insert(0, str(ROOT))
    from porting.env import cpu_model   # the one reader of /proc/cpuinfo's model name

    return cpu_model()


if __name__ == "__main__":
    main()
