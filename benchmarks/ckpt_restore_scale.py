"""Index cost of restoring and merging a synthetic 13B per-rank checkpoint (TP 8 x DP 8, ZeRO-1), per rank.

The layout is the one `port train recipes/13b-32card.yaml` writes (Llama-2-13B, bf16 parameters with fp32
masters and AdamW m and v, the recipe's flat buckets; porting/train/run/checkpoint/merge.py ``target_layout``). No
rank file exists: ``RankFiles.read`` is replaced by a stand-in that returns the right number of elements
(the real index code runs: ``Source.assemble`` with every piece lookup, range mapping and copy), so what is
timed is the CPU work between the reads, the part that does not shrink with a faster filesystem.

Three scenarios, each the calls the real code makes:
- same-layout resume: rank 0 of TP 8 x DP 8 reads its TP-local weights and its ZeRO share of masters, m, v
  (porting/train/run/checkpoint/read.py ``restore``);
- TP 8 -> TP 4 (x DP 16, ZeRO-1): rank 0 of the new layout, the same calls;
- full merge: every parameter whole (``port ckpt merge``, ckpt_merge.py ``write_weights``).

``--layers N`` builds the model with N of its 40 layers and scales the layer part of the time to 40
(every layer has the same shapes); the old code took minutes per layer group, so its "before" figure is
measured at 2 layers and scaled.

    python benchmarks/ckpt_restore_scale.py                 # all 40 layers
    python benchmarks/ckpt_restore_scale.py --layers 2      # quick; scaled to 40
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))


def layouts(layers: int):
    """(TP 8 x DP 8 layout, TP 4 x DP 16 layout) of Llama-2-13B with ``layers`` layers."""
    from model_zoo import presets
    from porting.train import load_recipe
    from porting.train.run.checkpoint.merge import target_layout
    from porting.train.run.checkpoint.format import Layout, ParamSpec

    cfg = presets.config("llama2-13b")
    h, i, v = cfg.hidden_size, cfg.intermediate_size, cfg.vocab_size
    kv = cfg.num_key_value_heads * (h // cfg.num_attention_heads)
    specs = [ParamSpec("embedding", (v, h), 0, "BF16")]
    for n in range(layers):   # model_zoo/llama.py order; column-parallel axis 0, row-parallel (o, down) axis 1
        p = f"layers.{n}."
        specs += [ParamSpec(p + "attention_norm", (h,), None, "BF16"), ParamSpec(p + "wq", (h, h), 0, "BF16"),
                  ParamSpec(p + "wk", (kv, h), 0, "BF16"), ParamSpec(p + "wv", (kv, h), 0, "BF16"),
                  ParamSpec(p + "wo", (h, h), 1, "BF16"), ParamSpec(p + "ffn_norm", (h,), None, "BF16"),
                  ParamSpec(p + "w1", (i, h), 0, "BF16"), ParamSpec(p + "w2", (h, i), 1, "BF16"),
                  ParamSpec(p + "w3", (i, h), 0, "BF16")]
    specs += [ParamSpec("norm", (h,), None, "BF16"), ParamSpec("lm_head", (v, h), 0, "BF16")]
    recipe = ROOT / "recipes" / "13b-32card.yaml"
    seed = Layout(64, 8, 1, True, tuple(specs), ())
    old = target_layout(seed, load_recipe(recipe, [], check_files=False))
    new = target_layout(seed, load_recipe(recipe, ["parallel.tensor_parallel=4"], check_files=False))
    return old, new


class StubFiles:
    """``RankFiles`` with the reads replaced: the right number of float32 elements, no I/O."""

    def __init__(self):
        self.bytes_read = self.header_bytes = self.check_bytes = 0
        self.dir = Path("synthetic")
        self.buf = np.zeros(0, np.float32)   # one buffer, grown as needed: the stand-in costs no allocation

    def read(self, name, key, code, lo, hi):
        self.bytes_read += (hi - lo) * (2 if code == "BF16" else 4)
        if len(self.buf) < hi - lo:
            self.buf = np.zeros(hi - lo, np.float32)
        return self.buf[:hi - lo]

    def close(self):
        pass


def source(layout):
    from porting.train.run.checkpoint import read as ckpt_read

    src = ckpt_read.Source.__new__(ckpt_read.Source)
    table = {f"rank_{r:05d}.safetensors": {} for r in range(layout.world)}
    try:
        ckpt_read.Source.__init__(src, Path("synthetic"), layout, table)
    except TypeError:   # the new Source takes the file checker too
        ckpt_read.Source.__init__(src, Path("synthetic"), layout, table, verify=False)
    src.files = StubFiles()
    return src


def resume_calls(src, new, rank: int) -> float:
    """Seconds of the calls ``restore`` makes for ``rank`` of layout ``new``."""
    from porting.train.run.checkpoint.format import zero_ranges

    t0 = time.perf_counter()
    tp, t, d = new.tp, rank % new.tp, rank // new.tp
    for spec in new.params:
        src.assemble("param", spec.name, tp, t, 0, spec.local_numel(tp), spec.axis)
    ranges = list(zero_ranges(new, d))
    for kind in new.kinds[1:]:
        for _, i, a, b, _ in ranges:
            spec = new.params[i]
            src.assemble(kind, spec.name, tp, t, a, b, spec.axis)
    return time.perf_counter() - t0


def merge_calls(src, layout) -> float:
    t0 = time.perf_counter()
    for spec in layout.params:
        src.full("param", spec.name)
    return time.perf_counter() - t0


def measure(layers: int) -> dict[str, float]:
    old, new = layouts(layers)
    src = source(old)
    return {"same-layout resume (s per rank)": resume_calls(src, old, 0),
            "TP 8 -> TP 4 resume (s per rank)": resume_calls(src, new, 0),
            "full merge (s)": merge_calls(src, old)}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=40)
    ap.add_argument("--json", default=None)
    args = ap.parse_args()
    base = measure(0)   # embedding, final norm, LM head: what does not repeat per layer
    got = measure(args.layers)
    out = {k: round(base[k] + (got[k] - base[k]) * 40 / args.layers, 2) if args.layers else got[k] for k in got}
    for k, v in out.items():
        print(f"{k:34} {v:10.2f}")
    print(f"(measured with {args.layers} of 40 layers, the layer part scaled to 40)")
    if args.json:
        Path(args.json).write_text(json.dumps({"layers": args.layers, "seconds": out}, indent=1))


if __name__ == "__main__":
    main()
