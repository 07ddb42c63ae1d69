"""`port train` under an address-space limit (``ulimit -v``) a couple of GiB above its real peak:
a bounded read used to ask for its whole 16 GiB bound up front and died with MemoryError under
``ulimit -v 8000000``. The tiny CPU run (stories260K) peaks at 3.4 GiB of address space on this machine
reading text, 4.5 GiB reading Parquet with packing, TensorBoard and the HF export (VmPeak; MindSpore and
pyarrow map most of it, resident memory is ~0.9 GiB): it runs under 6.5 GiB, about 2 GiB above that."""

from __future__ import annotations

import re
import resource
import subprocess
import sys

import pytest

from tests.helpers import ROOT

LIMIT_GIB = 6.5
SAMPLE = ROOT / "porting" / "train" / "assets" / "tinystories_sample.txt"
# `python -m porting ARGS` that prints its peak address space and resident set at exit
WRAPPER = ("import atexit, re, runpy, sys\n"
           "atexit.register(lambda: print('PEAK', *re.findall(r'(?:VmPeak|VmHWM):\\s*(\\d+)', "
           "open('/proc/self/status').read()), file=sys.stderr))\n"
           "sys.argv = ['porting'] + sys.argv[1:]\n"
           "runpy.run_module('porting', run_name='__main__')\n")


def _limit() -> None:
    cap = int(LIMIT_GIB * (1 << 30))
    resource.setrlimit(resource.RLIMIT_AS, (cap, cap))


@pytest.mark.slow
def test_port_train_runs_a_few_gib_above_its_peak(tmp_path):
    import pyarrow as pa
    import pyarrow.parquet as pq

    docs = [d.strip() for d in SAMPLE.read_text().split("<|endoftext|>") if d.strip()]
    pq.write_table(pa.table({"text": docs}), tmp_path / "stories.parquet")
    args = ["train", "recipes/tiny-cpu.yaml", "--run-dir", str(tmp_path / "run"),
            "--set", f"data.path={tmp_path / 'stories.parquet'}", "--set", "data.format=text",
            "--set", "schedule.max_steps=2", "--set", "logging.tensorboard=true",
            "--set", "batching.packing=true", "--set", "batching.bucketing.boundaries=[]"]
    p = subprocess.run([sys.executable, "-c", WRAPPER, *args], cwd=ROOT, capture_output=True, text=True,
                       timeout=600, preexec_fn=_limit, env={**__import__("os").environ, "PYTHONPATH": str(ROOT),
                                                            "GLOG_v": "3"})
    assert p.returncode == 0 and "done: 2 steps" in p.stdout, p.stderr[-3000:]
    peak_kib, rss_kib = map(int, re.search(r"^PEAK (\d+) (\d+)$", p.stderr, re.M).groups())
    assert peak_kib < LIMIT_GIB * (1 << 20) and rss_kib < peak_kib
    assert (tmp_path / "run" / "hf" / "port_manifest.json").is_file() and any((tmp_path / "run" / "tensorboard").iterdir())
    print(f"VmPeak {peak_kib / (1 << 20):.2f} GiB, VmHWM {rss_kib / (1 << 20):.2f} GiB under RLIMIT_AS {LIMIT_GIB} GiB")
