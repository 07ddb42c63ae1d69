"""What ``logging.fingerprint_every`` costs a step: `port train` with it 0, 1 and 10, side by side, at the 2048-wide
shape, and the bytes it writes per sampled step.

The model: a random-weight Llama 2048 wide x 2 layers (intermediate 5632, 16 heads, vocabulary 512: about 120 M
parameters, the 2048-wide shape of benchmarks/pynative_pipeline.py and grad_overlap.py), written once as an HF
checkpoint with stories260K's tokenizer; the data: recipes/tiny-cpu.yaml's text, ``data.max_seq_length`` 64, one
padded shape, micro-batch 4, 1 device. Each round runs `port train` once per setting, in an order that rotates
every round (a change in the machine's load hits all of them); a setting's step time is the median of its runs'
``step_time_s`` (metrics.jsonl) after the first step. The fingerprint work (the host copies of the parameters,
the hashes, the forward hooks) runs inside the timed step (porting/train/run/loop.py), so the ratio is its whole
cost. With ``every 10`` the median step is an unsampled one; the mean over the steps is reported too (a 1-in-10
sampled step included).

    python benchmarks/fingerprint_cost.py                                  # PyNative, 2 rounds, 12 steps
    python benchmarks/fingerprint_cost.py --execution graph --rounds 2 --json cost.json
    git worktree add --detach /tmp/port-old dcb5ec0   # another port's code, run in the same rotation (every 0, 1)
    python benchmarks/fingerprint_cost.py --rounds 3 --against /tmp/port-old
    python benchmarks/fingerprint_cost.py --dp 2 --rounds 1 --steps 8   # 2 msrun workers: the collectives' records too
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
EVERY = (0, 1, 10)


def model_dir(work: Path) -> Path:
    """The 2048-wide random-weight HF checkpoint with stories260K's tokenizer."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    src = ROOT / "model_zoo" / "assets" / "stories260k"
    out = work / "llama2048"
    torch.manual_seed(0)
    cfg = LlamaConfig(vocab_size=512, hidden_size=2048, intermediate_size=5632, num_hidden_layers=2,
                      num_attention_heads=16, num_key_value_heads=16, max_position_embeddings=256,
                      tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    LlamaForCausalLM(cfg).save_pretrained(out, safe_serialization=True)
    for name in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json", "special_tokens_map.json"):
        if (src / name).exists():
            shutil.copyfile(src / name, out / name)
    return out


def launch(hf: Path, every: int, steps: int, execution: str, run: Path, code: Path | None = None,
           dp: int = 1) -> dict:
    sets = [f"cluster.devices_per_node={dp}", f"model.source={hf}", "data.max_seq_length=64", "batching.bucketing.enabled=false",
            "checkpointing.export_hf=false", "checkpointing.every_steps=0", f"schedule.max_steps={steps}",
            f"execution={execution}", f"logging.fingerprint_every={every}", f"output_dir={run}"]
    argv = [sys.executable, "-m", "porting", "train", str(ROOT / "recipes" / "tiny-cpu.yaml")]
    for s in sets:
        argv += ["--set", s]
    env = {**os.environ, "GLOG_v": "3"}
    if code is not None:   # that checkout's porting/ first on the path, run from there
        env["PYTHONPATH"] = os.pathsep.join([str(code)] + [x for x in [env.get("PYTHONPATH")] if x])
    p = subprocess.run(argv, capture_output=True, text=True, timeout=3600, env=env, cwd=code)
    if p.returncode:
        raise SystemExit(f"every {every}: port train failed ({p.returncode}):\n{p.stderr[-3000:]}")
    rows = [json.loads(x) for x in (run / "metrics.jsonl").read_text().splitlines() if x.strip()]
    times = [r["step_time_s"] for r in rows if "step" in r and r.get("event") != "summary"][1:]
    prints = sorted((run / "fingerprints").glob("rank_*.jsonl")) if every else []
    size = sum(f.stat().st_size for f in prints)
    sampled = steps // every if every else 0
    shutil.rmtree(run)   # its final checkpoint is 1.4 GB (weights and AdamW moments): one run's at a time
    return {"step_time_s": times, "fingerprint_bytes": size,
            "bytes_per_sampled_step": round(size / sampled) if sampled else 0}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--rounds", type=int, default=2)
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--execution", choices=("pynative", "graph"), default="pynative")
    ap.add_argument("--json", type=Path, default=None)
    ap.add_argument("--dp", type=int, default=1, help="data-parallel msrun workers (2: the gradient all-reduce's "
                                                       "fingerprints join the cost)")
    ap.add_argument("--against", type=Path, default=None,
                    help="another checkout of port: its every 0 and every 1 join each round's rotation")
    a = ap.parse_args()
    settings = [(e, None) for e in EVERY] + ([(0, a.against), (1, a.against)] if a.against else [])
    res: dict[tuple, list[dict]] = {s: [] for s in settings}
    load = [os.getloadavg()[0]]
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="port-fpcost-") as tmp:
        work = Path(tmp)
        hf = model_dir(work)
        for i in range(a.rounds):
            k = i % len(settings)
            for e, code in settings[k:] + settings[:k]:
                tag = f"e{e}{'-against' if code else ''}-{i}"
                res[(e, code)].append(launch(hf, e, a.steps, a.execution, work / tag, code, a.dp))
                load.append(os.getloadavg()[0])
    out = {"cpu": _cpu(), "execution": a.execution, "dp": a.dp, "rounds": a.rounds, "steps": a.steps, "load_1min": load,
           "wall_s": round(time.perf_counter() - t0, 1)}
    for e, code in settings:
        times = [t for r in res[(e, code)] for t in r["step_time_s"]]
        out[_key(e, code)] = {"median_step_s": statistics.median(times), "mean_step_s": statistics.fmean(times),
                              "bytes_per_sampled_step": res[(e, code)][0]["bytes_per_sampled_step"],
                              "round_medians_s": [statistics.median(r["step_time_s"]) for r in res[(e, code)]]}
    for e, code in settings:
        base = out[_key(0, code)]
        if e:
            out[_key(e, code)]["ratio_median"] = out[_key(e, code)]["median_step_s"] / base["median_step_s"]
            out[_key(e, code)]["ratio_mean"] = out[_key(e, code)]["mean_step_s"] / base["mean_step_s"]
    if a.against:
        out["against"] = str(a.against)
    print(json.dumps(out, indent=1))
    if a.json:
        a.json.write_text(json.dumps(out, indent=1))


def _key(every: int, code: Path | None) -> str:
    return f"every_{every}" + ("_against" if code is not None else "")


def _cpu() -> str:
    sys.path.insert(0, str(ROOT))
    from porting.env import cpu_model   # the one reader of /proc/cpuinfo's model name

    return f"{cpu_model()}, {os.cpu_count()} logical cores"


if __name__ == "__main__":
    main()
