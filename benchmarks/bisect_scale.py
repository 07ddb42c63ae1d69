"""Benchmark: `port bisect` at the 1.1B shape (TinyLlama-1.1B widths), time and peak RSS, side by side
with the plain one-shot parity check it extends (`port verify --grads`: one forward and backward per
side, logits, loss and gradient norms only).

The HF directory is built on the fly: config.json from the ``tinyllama-1.1b`` preset with
``--layers`` decoder layers (hidden 2048, intermediate 5632, 32 heads / 4 KV heads, vocab 32000,
untied head), float32 weights drawn from N(0, 0.02) (random bytes, as converters/synthetic.py writes,
would hold NaNs), converted to MindSpore with `port convert`. Each measured command runs in a child
process of its own; its peak RSS is that child's ru_maxrss.

    python benchmarks/bisect_scale.py [--layers 2] [--seq 128] [--batch 1] [--dir /tmp/port_bisect_bench]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

CHILD = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
t0 = time.perf_counter()
if {what!r} == "bisect":
    from porting.bisect.run import bisect
    r = bisect({hf!r}, {ms!r}, batch={batch}, seq={seq})
    out = {{"verdict": r["verdict"], "rows": len(r["rows"]), "seconds": r["seconds"]}}
else:
    from porting.verify.parity import check_parity
    r = check_parity({hf!r}, ms_dir={ms!r}, batch={batch}, seq={seq}, grads=True, hidden_states=True)
    out = {{"passed": r["passed"], "seconds": r["seconds"]}}
out["wall_s"] = round(time.perf_counter() - t0, 2)
out["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 3)
print("RESULT " + json.dumps(out))
"""


def make_model(d: Path, layers: int) -> tuple[Path, Path, int]:
    import numpy as np
    from safetensors.numpy import save_file

    from converters import convert, names
    from model_zoo import presets

    cfg = dataclasses.replace(presets.config("tinyllama-1.1b"), num_hidden_layers=layers)
    hf, ms = d / "hf", d / "ms"
    hf.mkdir(parents=True)
    rng = np.random.default_rng(0)
    shapes = names.expected_hf_shapes(cfg)
    tensors = {n: (np.ones(s, np.float32) if n.endswith("norm.weight") else
                   rng.standard_normal(s, dtype=np.float32) * np.float32(0.02)) for n, s in shapes.items()}
    save_file(tensors, str(hf / "model.safetensors"), metadata={"format": "pt"})
    (hf / "config.json").write_text(json.dumps({**cfg.to_hf(), "torch_dtype": "float32"}, indent=2))
    convert.hf_to_ms(hf, ms)
    return hf, ms, cfg.num_parameters()


def measure(what: str, hf: Path, ms: Path, batch: int, seq: int) -> dict:
    code = CHILD.format(root=str(ROOT), what=what, hf=str(hf), ms=str(ms), batch=batch, seq=seq)
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=3600)
    line = [ln for ln in p.stdout.splitlines() if ln.startswith("RESULT ")]
    if p.returncode or not line:
        raise SystemExit(f"{what} failed ({p.returncode}):\n{p.stderr[-3000:]}")
    return json.loads(line[0][7:])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--seq", type=int, default=128)
    ap.add_argument("--batch", type=int, default=1)
    ap.add_argument("--dir", type=Path, default=Path("/tmp/port_bisect_bench"))
    a = ap.parse_args()
    shutil.rmtree(a.dir, ignore_errors=True)
    t0 = time.perf_counter()
    hf, ms, n = make_model(a.dir, a.layers)
    print(f"model: TinyLlama-1.1B widths, {a.layers} layers, {n / 1e6:.0f}M parameters (fp32 {n * 4 / 2**30:.2f} GiB); "
          f"batch {a.batch} x {a.seq}; built in {time.perf_counter() - t0:.1f} s")
    for what in ("verify --grads", "bisect"):
        r = measure(what.split()[0], hf, ms, a.batch, a.seq)
        print(f"{what:15} wall {r['wall_s']:7.1f} s  peak RSS {r['peak_rss_gib']:6.2f} GiB  {json.dumps(r)}")
    shutil.rmtree(a.dir, ignore_errors=True)


if __name__ == "__main__":
    main()
