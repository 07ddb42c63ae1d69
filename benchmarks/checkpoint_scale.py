"""Per-rank checkpoints at two model sizes and two layouts, under real msrun workers (4 on this CPU).

For each (model, layout): `port train` runs 1 step and saves (every rank writes its own file), then
`port train --resume` restores it (no further step: only the start-up and the restore run). From every
rank's log (porting/train/run/checkpoint/format.py, ckpt_read.py) it reports, each divided by that rank's shard
(the bytes of its TP slice of the weights plus its share of fp32 masters and AdamW m and v):
- bytes written at the save;
- bytes read on resume (headers included);
- peak host RSS during the save above the RSS just before it (the save's own transient);
- peak host RSS of the resumed worker (start-up, model build, HF load, ZeRO set-up and restore) above
  the import baseline (a process that imported MindSpore and port), and that in MiB.
The two models are random-weight Llama configs built here, one ~30x the other. What must hold: the ratios do not grow with the model size.

    python benchmarks/checkpoint_scale.py            # ~5 min on 2 cores
    python benchmarks/checkpoint_scale.py --json out.json
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

MODELS = {
    "small": dict(vocab_size=512, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=False),
    "large": dict(vocab_size=4096, hidden_size=256, intermediate_size=688, num_hidden_layers=4,
                  num_attention_heads=8, num_key_value_heads=4, tie_word_embeddings=False),
}
LAYOUTS = {
    "DP4 ZeRO-1": ["parallel.optimizer_sharding=true", "batching.micro_batch_size=1"],
    "TP2 x DP2 ZeRO-1": ["parallel.tensor_parallel=2", "parallel.optimizer_sharding=true",
                         "batching.micro_batch_size=1", "batching.grad_accum_steps=2"],
}
COMMON = ["data.max_seq_length=64", "batching.bucketing.enabled=false", "checkpointing.export_hf=false",
          "cluster.devices_per_node=4", "checkpointing.every_steps=0", "schedule.warmup_steps=0"]
SAVE = re.compile(r"checkpoint step \d+: this rank wrote (\d+) bytes \(its shard (\d+) bytes\); peak host RSS "
                  r"during the save \+(-?\d+) bytes")
READ = re.compile(r"resume read (\d+) bytes .*?this rank's shard (\d+) bytes.*peak host RSS since start (\d+) bytes")


def model_dir(name: str, out: Path) -> Path:
    """An HF directory of a random-weight Llama (normal, std 0.02; norms 1) with stories260K's tokenizer."""
    import numpy as np
    from safetensors.numpy import save_file

    from converters import names
    from model_zoo.config import LlamaConfig

    cfg = LlamaConfig(max_position_embeddings=256, **MODELS[name])
    d = out / name
    d.mkdir(parents=True)
    rng = np.random.default_rng(0)
    save_file({n: (np.ones(s, np.float32) if len(s) == 1 else (0.02 * rng.standard_normal(s)).astype(np.float32))
               for n, s in names.expected_hf_shapes(cfg).items()}, str(d / "model.safetensors"))
    (d / "config.json").write_text(json.dumps({**cfg.to_hf(), "torch_dtype": "float32"}))
    for f in ("tokenizer.json", "tokenizer.model", "tokenizer_config.json"):
        shutil.copyfile(ROOT / "model_zoo" / "assets" / "stories260k" / f, d / f)
    return d


def import_baseline() -> int:
    """RSS of a process that imported MindSpore and port's training loop (what every worker starts from)."""
    code = ("import mindspore, porting.train.run.loop, porting.train.run.checkpoint.read, re;"
            "print(re.search(r'VmRSS:\\s+(\\d+)', open('/proc/self/status').read()).group(1))")
    p = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True,
                       env=dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3"))
    return int(p.stdout.split()[-1]) * 1024


def port_train(run: Path, sets: list[str], resume: bool) -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        free = s.getsockname()[1]
    args = [a for x in sets + [f"cluster.master_port={free}"] for a in ("--set", x)]
    p = subprocess.run([sys.executable, "-m", "porting", "train", str(ROOT / "recipes" / "tiny-cpu.yaml"),
                        "--run-dir", str(run), *args, *(["--resume"] if resume else [])], cwd=ROOT,
                       capture_output=True, text=True, timeout=900,
                       env=dict(os.environ, PYTHONPATH=str(ROOT), GLOG_v="3"))
    if p.returncode != 0:
        raise SystemExit(f"port train failed:\n{p.stderr[-3000:]}")


def measure(mdir: Path, layout: list[str], run: Path, base: int) -> list[dict]:
    sets = COMMON + layout + [f"model.source={mdir}", "schedule.max_steps=1"]
    port_train(run, sets, resume=False)
    port_train(run, sets, resume=True)   # restores step 1; no step left to run
    rows = []
    for r in range(4):
        log = (run / "logs" / f"rank_{r}.log").read_text()
        w, shard, grew = (int(x) for x in SAVE.findall(log)[0])
        read, shard2, peak = (int(x) for x in READ.findall(log)[-1])
        assert shard == shard2, (shard, shard2)
        rows.append({"rank": r, "shard_bytes": shard, "written": w / shard, "read": read / shard,
                     "save_rss": grew / shard, "resume_peak_rss": (peak - base) / shard,
                     "resume_peak_rss_mib": (peak - base) / 2**20})
    return rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--json", default=None, help="also write the results here")
    args = ap.parse_args()
    base = import_baseline()
    print(f"import baseline RSS {base / 2**20:.0f} MiB")
    out, results = Path(tempfile.mkdtemp(prefix="ckpt-scale-")), {}
    try:
        for name in MODELS:
            mdir = model_dir(name, out)
            from model_zoo.config import LlamaConfig

            n = LlamaConfig.from_hf(mdir).num_parameters()
            for lname, layout in LAYOUTS.items():
                rows = measure(mdir, layout, out / f"{name}-{len(results)}", base)
                results[f"{name} ({n / 1e6:.2f} M) {lname}"] = rows
                print(f"\n{name} ({n / 1e6:.2f} M parameters), {lname}")
                print(f"  {'rank':>4} {'shard':>12} {'written':>8} {'read':>8} {'save RSS':>9} {'resume RSS':>11}")
                for x in rows:
                    print(f"  {x['rank']:>4} {x['shard_bytes']:>12,} {x['written']:>8.3f} {x['read']:>8.3f} "
                          f"{x['save_rss']:>9.3f} {x['resume_peak_rss']:>11.1f} ({x['resume_peak_rss_mib']:.0f} MiB)")
    finally:
        shutil.rmtree(out, ignore_errors=True)
    if args.json:
        Path(args.json).write_text(json.dumps({"import_baseline_bytes": base, "runs": results}, indent=1))


if __name__ == "__main__":
    main()
