"""`port ckpt merge --out` (one streamed pass, issue 46) against `cp -r` + sync of the checkpoint, and against the
code before it (a `git archive` of ``--base``), side by side in one run, at two widths; outputs compared byte for byte.

Each checkpoint is real: `port train` under 2 msrun workers in DP 2 with ZeRO-1 (so the merge gathers every
weight from two rank files), one step of a random-weight Llama (fp32: weights, AdamW m and v), then saved:

- ``small``: 1024 wide, 2 layers, vocabulary 2048: about 0.36 GB of rank files;
- ``wide``:  2048 wide, 2 layers, vocabulary 4096 (benchmarks/ckpt_io_speed.py's model): about 1.43 GB;
- ``w3072``: 3072 wide, 1 layer, intermediate 6144, vocabulary 4096: about 1.43 GB at another width (the issue's
  "1.4 GB at two widths"; ``--models`` picks which).

Timed per round, in turn (the page cache warm: one round first, not counted), each followed by ``sync`` so the
bytes are on disk as ``cp -r`` + ``sync``'s are: ``cp -r`` of the checkpoint; `port ckpt merge CK --out HF` of
this checkout; the same command of the base commit. Each merge is divided by its own round's ``cp -r`` (on a
shared machine the load moves between rounds more than within one); the best and the median of those ratios
are printed, with each command's CPU seconds. The command's own start-up (`port ckpt merge` of the stories260K
checkpoint of a 2-step tiny run) is measured the same way and reported beside, not subtracted. Python runs
with its bytecode cached, as from an install.
The outputs of the two codes are compared file by file (sha256) and the manifests key by key, less
``created`` (a time), ``source.dir`` (the staging folder's name held the pid; now the checkpoint),
``output.bytes_written_by`` (copied in the kernel from the staged file before; written from user space now)
and ``command[0]`` (the path of the checkout that ran).

    python benchmarks/merge_speed.py --keep /tmp/mergebench              # trains once, keeps the checkpoints
    python benchmarks/merge_speed.py --keep /tmp/mergebench --rounds 5   # reuses them
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import resource
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

BASE = "1828555"   # main before the one pass: port ckpt merge staged MindSpore names, then converted them
MODELS = {
    "small": dict(vocab_size=2048, hidden_size=1024, intermediate_size=2816, num_hidden_layers=2,
                  num_attention_heads=8, num_key_value_heads=8, tie_word_embeddings=False),
    "wide": dict(vocab_size=4096, hidden_size=2048, intermediate_size=5632, num_hidden_layers=2,
                 num_attention_heads=16, num_key_value_heads=16, tie_word_embeddings=False),
    "w3072": dict(vocab_size=4096, hidden_size=3072, intermediate_size=6144, num_hidden_layers=1,
                  num_attention_heads=24, num_key_value_heads=24, tie_word_embeddings=False),
}
COMMON = ["data.max_seq_length=32", "batching.bucketing.enabled=false", "checkpointing.export_hf=false",
          "checkpointing.every_steps=0", "schedule.warmup_steps=0", "schedule.max_steps=1"]
DP2_ZERO1 = ["cluster.devices_per_node=2", "parallel.optimizer_sharding=true", "batching.micro_batch_size=1",
             "batching.grad_accum_steps=2"]
PER_RUN = ("created", "source.dir", "output.bytes_written_by")
from benchmarks.ckpt_io_speed import free_port, port, sets  # noqa: E402  (the same launch helpers, one copy)


def timed(argv: list[str], cwd: Path | None = None, code: Path | None = None) -> tuple[float, float]:
    """(seconds of ``argv`` then ``sync``, CPU seconds of ``argv``). Python runs as from an install: its bytecode
    is cached (PYTHONDONTWRITEBYTECODE, set where this was first run, would compile port's modules every time)."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
    env.update({"PYTHONPATH": str(code), "GLOG_v": "3"} if code else {})
    c0, t0 = resource.getrusage(resource.RUSAGE_CHILDREN), time.perf_counter()
    p = subprocess.run(argv, cwd=cwd, env=env, capture_output=True, text=True)
    c1 = resource.getrusage(resource.RUSAGE_CHILDREN)
    if p.returncode != 0:
        raise SystemExit(f"{' '.join(argv[:4])} failed:\n{p.stderr[-3000:]}")
    subprocess.run(["sync"], check=True)
    return time.perf_counter() - t0, c1.ru_utime + c1.ru_stime - c0.ru_utime - c0.ru_stime


def build(work: Path) -> dict[str, Path]:
    """The checkpoints (trained here once; reused from ``work`` when there)."""
    from benchmarks import checkpoint_scale

    checkpoint_scale.MODELS.update(MODELS)
    cks = {}
    for name in MODELS:
        ck = work / f"{name}-run" / "checkpoints" / "step_1"
        if not ck.is_dir():
            mdir = work / name if (work / name / "config.json").is_file() else checkpoint_scale.model_dir(name, work)
            port(ROOT, "train", str(ROOT / "recipes" / "tiny-cpu.yaml"), "--run-dir", str(work / f"{name}-run"),
                 *sets(COMMON + DP2_ZERO1 + [f"model.source={mdir}", free_port()]))
        cks[name] = ck
    tiny = work / "tiny-run" / "checkpoints" / "step_2"
    if not tiny.is_dir():
        port(ROOT, "train", str(ROOT / "recipes" / "tiny-cpu.yaml"), "--run-dir", str(work / "tiny-run"),
             *sets(COMMON[:-1] + ["schedule.max_steps=2"]))
    cks["tiny"] = tiny
    return cks


def _files(d: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(d.iterdir())
            if p.name != "port_manifest.json"}


def _manifest(d: Path) -> dict:
    m = json.loads((d / "port_manifest.json").read_text())
    for key in PER_RUN:
        *path, last = key.split(".")
        node = m
        for part in path:
            node = node[part]
        node.pop(last)
    m["command"] = m["command"][1:]
    if m.get("output", {}).get("not_copied") == []:   # added after the base (issue 51: companions not copied, a FIFO)
        m["output"].pop("not_copied")
    return m


def same_output(a: Path, b: Path) -> str:
    """'' when the two outputs are byte-identical but for the per-run manifest keys, else what differs."""
    fa, fb = _files(a), _files(b)
    if fa != fb:
        return f"files differ: {sorted(set(fa.items()) ^ set(fb.items()))[:4]}"
    ma, mb = _manifest(a), _manifest(b)
    return "" if ma == mb else f"manifest keys differ: {[k for k in ma if ma[k] != mb.get(k)]}"


def measure(ck: Path, old: Path, work: Path, rounds: int) -> dict:
    """Interleaved rounds of cp -r, new merge, old merge (each + sync); the first round warms the cache and
    keeps both merges' outputs (at the same --out path, so the recorded commands match) to compare."""
    out = work / "out"
    codes = {"cp -r": None, "one pass": ROOT, "base": old}
    runs: dict[str, list] = {k: [] for k in codes}
    merge = [sys.executable, "-m", "porting", "ckpt", "merge", str(ck), "--out", str(out)]
    for r in range(rounds + 1):
        for what, code in codes.items():
            shutil.rmtree(out, ignore_errors=True)
            subprocess.run(["sync"], check=True)
            argv = ["cp", "-r", str(ck), str(out)] if code is None else merge
            s = timed(argv, cwd=code, code=code)
            if r:
                runs[what].append(s)
            elif code is not None:
                shutil.rmtree(work / what, ignore_errors=True)
                out.rename(work / what)
    same = same_output(work / "one pass", work / "base")
    for d in (out, work / "one pass", work / "base"):
        shutil.rmtree(d, ignore_errors=True)
    size = sum(p.stat().st_size for p in ck.iterdir())
    return {"bytes": size, "runs": runs, "identical": same == "", "diff": same}


def summary(name: str, r: dict) -> str:
    """Per round: each merge's seconds over that round's cp -r (the same load); best and median over rounds."""
    runs = r["runs"]
    med = (lambda xs: sorted(xs)[len(xs) // 2])  # noqa: E731
    cp = [s for s, _ in runs["cp -r"]]
    parts = [f"{name:5} {r['bytes'] / 1e9:.2f} GB: cp -r + sync {min(cp):.2f} s (median {med(cp):.2f})"]
    for what in ("one pass", "base"):
        secs = [s for s, _ in runs[what]]
        ratio = [s / c for s, c in zip(secs, cp)]
        parts.append(f"{what} {min(secs):.2f} s (median {med(secs):.2f}, {med([c for _, c in runs[what]]):.2f} "
                     f"CPU-s), x cp per round: best {min(ratio):.2f}, median {med(ratio):.2f}")
    return "; ".join(parts) + f"; outputs {'byte-identical' if r['identical'] else 'DIFFER: ' + r['diff']}"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--base", default=BASE, help="the commit whose `port ckpt merge` is the before (git archive)")
    ap.add_argument("--rounds", type=int, default=3)
    ap.add_argument("--keep", type=Path, default=None, help="build the checkpoints here and keep them (reused)")
    ap.add_argument("--json", default=None)
    ap.add_argument("--models", default=",".join(MODELS), help=f"comma-separated, of {', '.join(MODELS)}")
    args = ap.parse_args()
    for name in set(MODELS) - set(args.models.split(",")):
        MODELS.pop(name)
    work = args.keep or Path(tempfile.mkdtemp(prefix="merge-speed-"))
    old = Path(tempfile.mkdtemp(prefix="merge-base-"))
    try:
        work.mkdir(parents=True, exist_ok=True)
        subprocess.run(f"git -C {ROOT} archive {args.base} | tar -x -C {old}", shell=True, check=True)
        cks = build(work)
        load0 = os.getloadavg()[0]
        rows = {name: measure(ck, old, work, args.rounds) for name, ck in cks.items()}
        from porting.env import cpu_model

        cpu = cpu_model()
        print(f"{cpu}, {os.cpu_count()} CPUs, load {load0:.1f} at the start, {os.getloadavg()[0]:.1f} at the end; "
              f"base {args.base}; "
              f"{args.rounds} rounds")
        for name, r in rows.items():
            print("  " + summary(name, r))
        if args.json:
            Path(args.json).write_text(json.dumps({"cpu": cpu, "base": args.base, "rows": rows}, indent=1))
        if not all(r["identical"] for r in rows.values()):
            raise SystemExit("the outputs of the two codes differ")
    finally:
        shutil.rmtree(old, ignore_errors=True)
        if args.keep is None:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
