"""Forward and greedy-generation speed of the zoo cell against HF transformers, same CPU, same run.

    python benchmarks/model_bench.py [--threads 2] [--json OUT]

Shapes: the real stories260K (embedded) and a 4-layer hidden-256 Llama (8 heads / 4 KV, vocab 1024)
with random weights. Forward: batch 8 x seq 256, MindSpore graph mode (compile time reported apart)
vs torch eager under no_grad. Generation: 60 greedy tokens after BOS, zoo static-cache decode vs HF
``generate`` (KV cache). Ratios > 1 mean the zoo is faster.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))


def _median_time(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def bench_model(hf_dir: Path, batch: int, seq: int, repeat: int) -> dict:
    import mindspore as ms
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    from converters.loading import load_hf_dir
    from model_zoo import LlamaConfig, build
    from model_zoo.decode import greedy

    cfg = LlamaConfig.from_hf(hf_dir)
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (batch, seq)).astype(np.int32)
    model = build(cfg)
    load_hf_dir(model, hf_dir)
    fwd = ms.jit(model.construct)
    x = ms.Tensor(ids)
    t0 = time.perf_counter()
    fwd(x).asnumpy()
    compile_s = time.perf_counter() - t0
    zoo_fwd = _median_time(lambda: fwd(x).asnumpy(), repeat)

    hf = AutoModelForCausalLM.from_pretrained(str(hf_dir), dtype=torch.float32, local_files_only=True).eval()
    tx = torch.tensor(ids, dtype=torch.long)
    with torch.no_grad():
        hf(tx)
        hf_fwd = _median_time(lambda: hf(tx).logits.numpy(), repeat)

    n_new = 60
    t0 = time.perf_counter()
    greedy(model, [1], n_new, cache="static")
    gen_first = time.perf_counter() - t0
    zoo_gen = _median_time(lambda: greedy(model, [1], n_new, cache="static"), 3)
    with torch.no_grad():
        gen = lambda: hf.generate(torch.tensor([[1]]), max_new_tokens=n_new, min_new_tokens=n_new,
                                  do_sample=False, pad_token_id=0)
        gen()
        hf_gen = _median_time(gen, 3)
    tokens = batch * seq
    return {
        "model": str(hf_dir.name), "params": cfg.num_parameters(), "batch": batch, "seq": seq,
        "forward": {"zoo_graph_compile_s": round(compile_s, 3), "zoo_s": round(zoo_fwd, 4), "hf_torch_s": round(hf_fwd, 4),
                    "zoo_tokens_per_s": round(tokens / zoo_fwd), "hf_tokens_per_s": round(tokens / hf_fwd),
                    "speed_ratio_zoo_over_hf": round(hf_fwd / zoo_fwd, 2)},
        "greedy_60": {"zoo_first_call_s_incl_compile": round(gen_first, 3), "zoo_s": round(zoo_gen, 3),
                      "hf_generate_s": round(hf_gen, 3), "speed_ratio_zoo_over_hf": round(hf_gen / zoo_gen, 2)},
    }


def make_random_hf(tmp: Path) -> Path:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    cfg = LlamaConfig(hidden_size=256, intermediate_size=688, num_hidden_layers=4, num_attention_heads=8,
                      num_key_value_heads=4, vocab_size=1024, max_position_embeddings=512)
    torch.manual_seed(0)
    LlamaForCausalLM(cfg).save_pretrained(tmp / "tiny-h256")
    return tmp / "tiny-h256"


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    import torch

    torch.set_num_threads(args.threads)
    from model_zoo import presets

    results = {"threads": args.threads, "cpu_count": os.cpu_count(), "runs": []}
    with tempfile.TemporaryDirectory() as tmp:
        for d in (presets.embedded_default_dir(), make_random_hf(Path(tmp))):
            r = bench_model(d, batch=8, seq=256, repeat=args.repeat)
            results["runs"].append(r)
            print(json.dumps(r), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
