"""Benchmark `port convert` against `cp -r` and the whole-model reference path, side by side in one run.

Generates random-weight bf16 HF checkpoints of the TinyLlama-1.1B shape (3 shards) and the Llama-7B
shape (written by our own streaming writer: header, then random bytes), then times, each in a child
process whose peak RSS comes from wait4(2):
  cp -r SRC            the floor: copying the bytes;
  port convert --hf    HF -> MindSpore safetensors, as by default (kernel-side copy, one SHA-256 pass:
                       every output tensor's digest), and with --source-hash (a second pass for the
                       source files' digests);
  port convert --ms    MindSpore -> HF;
  verify_checkpoint    tensor-by-tensor comparison (+ the HF -> MS -> HF round trip);
  reference            transformers from_pretrained + NumPy fp32 + mindspore.save_checkpoint
                       (the MindFormers-style path; only where it fits in memory).
The page cache is warmed by reading the source once, so every path reads from memory alike.
Not part of the test suite. Usage (results go to stdout as a Markdown table and to --json):

    python benchmarks/convert_bench.py --sizes 1.1b,7b --workdir /tmp/port-bench --json bench.json
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from converters.synthetic import write_random_hf  # noqa: E402
from model_zoo import presets  # noqa: E402

PATHS = ("cp", "convert_hf_to_ms", "convert_hf_to_ms_source_hash", "convert_ms_to_hf", "verify_tensors",
         "verify_with_roundtrip", "reference")
SIZES = {"1.1b": ("tinyllama-1.1b", 3), "7b": ("llama-7b", 3)}  # preset, number of shards


def make_checkpoint(preset: str, shards: int, out: Path) -> int:
    """A bf16 HF checkpoint of the preset's shape, random bytes, sharded like save_pretrained."""
    return write_random_hf(presets.config(preset), out, shards, "BF16")


def busy_cpu_s() -> float:
    """CPU seconds all processes have used since boot (/proc/stat), to tell how much of a timed run the
    machine spent on other people's jobs."""
    fields = [int(x) for x in Path("/proc/stat").read_text().splitlines()[0].split()[1:]]
    user, nice, system, idle, iowait, irq, softirq, steal = (fields + [0] * 8)[:8]
    return (user + nice + system + irq + softirq + steal) / os.sysconf("SC_CLK_TCK")


def run(cmd: list[str]) -> dict:
    """Wall time and peak RSS of one command. Dirty pages of the previous step are flushed first (not
    timed), so no step pays for another's writeback. RSS comes from GNU time (%M): wait4 on a child
    forked from this process would count this process's own pages copied at fork."""
    os.sync()
    rss_file = Path(os.environ.get("TMPDIR", "/tmp")) / f"port-bench-rss-{os.getpid()}"
    load_before = os.getloadavg()[0]
    busy0, t0 = busy_cpu_s(), time.perf_counter()
    proc = subprocess.run(["/usr/bin/time", "-o", str(rss_file), "-f", "%M %U %S", *cmd], cwd=ROOT,
                          capture_output=True, text=True)
    wall, busy = time.perf_counter() - t0, busy_cpu_s() - busy0
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    kib, user, sys_s = rss_file.read_text().strip().splitlines()[-1].split()
    rss_file.unlink()
    cpu = float(user) + float(sys_s)
    return {"wall_s": round(wall, 2), "peak_rss_gib": round(int(kib) / 2**20, 3), "cpu_s": round(cpu, 2),
            "loadavg_1m_before": round(load_before, 2),
            # CPU time the rest of the machine (other jobs, kernel writeback threads) used meanwhile
            "others_cpu_s": round(max(0.0, busy - cpu), 2),
            "stdout": proc.stdout[-400:]}


REFERENCE = """
import sys, numpy as np, torch, mindspore as ms, transformers
from converters import names
m = transformers.AutoModelForCausalLM.from_pretrained(sys.argv[1], dtype=torch.bfloat16)
table = names.NAME_MAPS[m.config.model_type]
params = [{"name": names.map_name(k, table), "data": ms.Tensor(v.float().numpy())}
          for k, v in m.state_dict().items() if not names.is_ignored_hf(k)]
del m
ms.save_checkpoint(params, sys.argv[2] + "/model.ckpt")
"""

VERIFY = """
import sys, json
from porting.verify.roundtrip import verify_checkpoint
rows = verify_checkpoint(sys.argv[1], sys.argv[2], roundtrip=sys.argv[3] == "1")
assert all(r.passed for r in rows), rows
print(json.dumps([(r.name, r.detail) for r in rows]))
"""


def warm(path: Path) -> None:
    for p in sorted(path.iterdir()):
        with open(p, "rb") as f:
            while f.read(64 << 20):
                pass


def best_of(n: int, cmd: list[str], cleanup: Path | None) -> dict:
    """The fastest of ``n`` runs (other jobs share this machine's 2 cores), with every wall time kept."""
    runs = []
    for i in range(n):
        if cleanup is not None:
            shutil.rmtree(cleanup, ignore_errors=True)
        runs.append(run(cmd))
    best = min(runs, key=lambda r: r["wall_s"])
    return {**best, "all_wall_s": [r["wall_s"] for r in runs],
            "peak_rss_gib": max(r["peak_rss_gib"] for r in runs)}


def bench_size(size: str, work: Path, reference: bool, repeats: int) -> dict:
    preset, shards = SIZES[size]
    src, dst = work / f"{size}-hf", work / f"{size}-out"
    for p in (src, dst):
        shutil.rmtree(p, ignore_errors=True)
    t0 = time.perf_counter()
    total = make_checkpoint(preset, shards, src)
    res: dict = {"size": size, "preset": preset, "bytes": sum(p.stat().st_size for p in src.iterdir()),
                 "tensor_bytes": total, "generate_s": round(time.perf_counter() - t0, 1),
                 "loadavg_before": os.getloadavg()}
    py = sys.executable
    warm(src)
    convert_cmd = [py, "-m", "porting", "convert", "--hf", str(src), "--out", str(dst), "--quiet"]
    # cp and convert alternate, so both see the same background load
    cps, convs, hashed = [], [], []
    for _ in range(repeats):
        cps.append(best_of(1, ["cp", "-r", str(src), str(dst)], dst))
        convs.append(best_of(1, convert_cmd, dst))
        hashed.append(best_of(1, convert_cmd + ["--source-hash"], dst))
    pick = lambda rs: {**min(rs, key=lambda r: r["wall_s"]), "all_wall_s": [r["wall_s"] for r in rs],
                       "peak_rss_gib": max(r["peak_rss_gib"] for r in rs)}
    res["cp"], res["convert_hf_to_ms"] = pick(cps), pick(convs)
    res["convert_hf_to_ms_source_hash"] = pick(hashed)
    res["verify_tensors"] = best_of(repeats, [py, "-c", VERIFY, str(src), str(dst), "0"], None)
    res["verify_with_roundtrip"] = best_of(1, [py, "-c", VERIFY, str(src), str(dst), "1"], None)
    back = work / f"{size}-back"
    res["convert_ms_to_hf"] = best_of(1, [py, "-m", "porting", "convert", "--ms", str(dst), "--out", str(back),
                                          "--quiet"], back)
    shutil.rmtree(back)
    shutil.rmtree(dst)
    if reference:
        dst.mkdir()
        res["reference"] = run([py, "-c", REFERENCE, str(src), str(dst)])
        shutil.rmtree(dst)
    shutil.rmtree(src)
    res["loadavg_after"] = os.getloadavg()
    cp = res["cp"]["wall_s"]
    for k in PATHS[1:]:
        if k in res:
            res[k]["x_cp"] = round(res[k]["wall_s"] / cp, 2)
    return res


def table(results: list[dict]) -> str:
    lines = ["| shape | GiB | path | wall s (best [all]) | x cp | CPU s | peak RSS GiB | others' CPU s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in results:
        for k in PATHS:
            if k in r:
                v = r[k]
                lines.append(f"| {r['preset']} | {r['bytes'] / 2**30:.2f} | {k} | {v['wall_s']} {v.get('all_wall_s', '')} | "
                             f"{v.get('x_cp', 1.0)} | {v['cpu_s']} | {v['peak_rss_gib']} | {v['others_cpu_s']} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="1.1b,7b")
    ap.add_argument("--workdir", default="/tmp/port-bench", type=Path)
    ap.add_argument("--reference", default="1.1b", help="sizes to run the whole-model reference path on")
    ap.add_argument("--repeats", type=int, default=3, help="runs of cp / convert / verify; the fastest counts")
    ap.add_argument("--json", type=Path)
    args = ap.parse_args()
    args.workdir.mkdir(parents=True, exist_ok=True)
    print(f"free disk at {args.workdir}: {shutil.disk_usage(args.workdir).free / 2**30:.1f} GiB", file=sys.stderr)
    results = []
    for size in args.sizes.split(","):
        results.append(bench_size(size, args.workdir, size in args.reference.split(","), args.repeats))
        print(json.dumps(results[-1], indent=1), file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))
    print(table(results))


if __name__ == "__main__":
    main()
