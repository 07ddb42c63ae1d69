"""`port ckpt reshard` and `port ckpt merge` of a real wide per-rank checkpoint against copying its bytes.

A random-weight Llama 2048 wide (2 layers, intermediate 5632, vocabulary 4096: 120 M parameters, fp32) is
trained for one step by `port train` under real msrun workers in TP 2 x DP 2 with ZeRO-1; its checkpoint
(weights, AdamW m and v: about 1.4 GB in 4 rank files) is then
- copied with `cp -r` and `sync` (the I/O floor; in the kernel) and with `dd` per file and `sync` (through
  user space, as any command that reads the bytes),
- resharded with `port ckpt reshard --to` TP 1 x DP 4 ZeRO-1 (every row-parallel weight re-cut),
- merged with `port ckpt merge --out` (HF) and with `--ms` (MindSpore names, no HF conversion).
Each command also runs on the stories260K checkpoint of a 2-step tiny run: its time is the command's fixed
cost (start-up, imports), subtracted before the ratio to the copy. The page cache is warm (each
command runs once before it is timed; the best of ``--repeat`` is kept).

    python benchmarks/ckpt_io_speed.py                       # this checkout
    python benchmarks/ckpt_io_speed.py --code /tmp/old-port  # another checkout (the "before" figure)
    python benchmarks/ckpt_io_speed.py --keep /tmp/ckw       # keep the checkpoints (reused by a rerun: profiling)
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

WIDE = dict(vocab_size=4096, hidden_size=2048, intermediate_size=5632, num_hidden_layers=2,
            num_attention_heads=16, num_key_value_heads=16, tie_word_embeddings=False)
COMMON = ["data.max_seq_length=32", "batching.bucketing.enabled=false", "checkpointing.export_hf=false",
          "checkpointing.every_steps=0", "schedule.warmup_steps=0"]
TP2_DP2 = ["cluster.devices_per_node=4", "parallel.tensor_parallel=2", "parallel.optimizer_sharding=true",
           "batching.micro_batch_size=1", "batching.grad_accum_steps=2"]
TO_DP4 = ["cluster.devices_per_node=4", "parallel.optimizer_sharding=true", "batching.micro_batch_size=1"]


def sets(xs: list[str]) -> list[str]:
    return [a for x in xs for a in ("--set", x)]


def free_port() -> str:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return f"cluster.master_port={s.getsockname()[1]}"


def port(code: Path, *args: str, timeout: int = 1800) -> float:
    """Seconds of one `port` command run from checkout ``code``."""
    t0 = time.perf_counter()
    p = subprocess.run([sys.executable, "-m", "porting", *args], cwd=code, capture_output=True, text=True,
                       timeout=timeout, env=dict(os.environ, PYTHONPATH=str(code), GLOG_v="3"))
    if p.returncode != 0:
        raise SystemExit(f"port {' '.join(args[:3])} failed:\n{p.stderr[-3000:]}")
    return time.perf_counter() - t0


def copy_time(ck: Path, dst: Path) -> float:
    t0 = time.perf_counter()
    subprocess.run(["cp", "-r", str(ck), str(dst)], check=True)
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - t0


def dd_time(ck: Path, dst: Path) -> float:
    """The same bytes through user space (read + write, 16 MiB blocks): coreutils `cp` copies in the kernel
    (copy_file_range on ext4), which a command that must look at the bytes (hash, re-cut) cannot."""
    t0 = time.perf_counter()
    dst.mkdir()
    for f in sorted(ck.iterdir()):
        subprocess.run(["dd", f"if={f}", f"of={dst / f.name}", "bs=16M", "status=none"], check=True)
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - t0


def best(fn, repeat: int, clean) -> float:
    out = []
    for _ in range(repeat + 1):   # the first warms the page cache
        clean()
        out.append(fn())
    clean()
    return min(out[1:])


def commands(code: Path, ck: Path, recipe: Path, work: Path, to: list[str], repeat: int) -> dict[str, float]:
    outs = [work / "resharded", work / "hf", work / "ms"]

    def clean():
        for o in outs:
            shutil.rmtree(o, ignore_errors=True)
        subprocess.run(["sync"], check=True)

    return {"copy": best(lambda: copy_time(ck, outs[0]), repeat, clean),
            "dd copy": best(lambda: dd_time(ck, outs[0]), repeat, clean),
            "reshard": best(lambda: port(code, "ckpt", "reshard", str(ck), "--to", str(recipe), *sets(to),
                                         "--out", str(outs[0])), repeat, clean),
            "merge": best(lambda: port(code, "ckpt", "merge", str(ck), "--out", str(outs[1])), repeat, clean),
            "merge --ms": best(lambda: port(code, "ckpt", "merge", str(ck), "--ms", str(outs[2])), repeat, clean)
            if _has_ms_merge(code) else float("nan")}


def _has_ms_merge(code: Path) -> bool:
    """Whether ``code``'s `port ckpt merge` has ``--ms`` (the checkpoint modules moved: run/ckpt_record.py, then
    run/checkpoint/record.py); a checkout without it gets NaN in that column."""
    cli = code / "porting" / "cli" / "ckpt.py"
    return cli.is_file() and '"--ms"' in cli.read_text(encoding="utf-8")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--code", type=Path, default=ROOT, help="the checkout whose `port` is timed")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--json", default=None)
    ap.add_argument("--keep", type=Path, default=None,
                    help="build the checkpoints in this folder and keep them (reused when already there: to profile)")
    args = ap.parse_args()
    from benchmarks.checkpoint_scale import MODELS, model_dir

    MODELS["wide"] = WIDE
    work = args.keep or Path(tempfile.mkdtemp(prefix="ckpt-io-"))
    recipe = args.code / "recipes" / "tiny-cpu.yaml"
    try:
        work.mkdir(parents=True, exist_ok=True)
        wide = work / "wide" if (work / "wide" / "config.json").is_file() else model_dir("wide", work)
        ck_wide = work / "wide-run" / "checkpoints" / "step_1"
        ck_tiny = work / "tiny-run" / "checkpoints" / "step_2"
        if not ck_wide.is_dir():
            port(args.code, "train", str(recipe), "--run-dir", str(work / "wide-run"),
                 *sets(COMMON + TP2_DP2 + [f"model.source={wide}", "schedule.max_steps=1", free_port()]))
        if not ck_tiny.is_dir():
            port(args.code, "train", str(recipe), "--run-dir", str(work / "tiny-run"),
                 *sets(COMMON + ["schedule.max_steps=2"]))
        size = sum(p.stat().st_size for p in ck_wide.iterdir())
        fixed = commands(args.code, ck_tiny, recipe, work, ["cluster.devices_per_node=1"], args.repeat)
        got = commands(args.code, ck_wide, recipe, work, TO_DP4 + [f"model.source={wide}"], args.repeat)
        rows = {k: {"seconds": round(got[k], 2), "fixed_s": round(fixed[k], 2),
                    "x_copy": round((got[k] - fixed[k]) / (got["copy"] - fixed["copy"]), 2),
                    "x_dd": round((got[k] - fixed[k]) / (got["dd copy"] - fixed["dd copy"]), 2)} for k in got}
        load = os.getloadavg()[0]
        print(f"checkpoint {size / 1e9:.2f} GB (TP 2 x DP 2 ZeRO-1, 2048 wide); load average {load:.1f}")
        for k, r in rows.items():
            print(f"  {k:11} {r['seconds']:7.2f} s  (fixed {r['fixed_s']:.2f} s)  {r['x_copy']:6.2f}x cp  "
                  f"{r['x_dd']:6.2f}x dd")
        if args.json:
            Path(args.json).write_text(json.dumps({"bytes": size, "load": load, "rows": rows}, indent=1))
    finally:
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
