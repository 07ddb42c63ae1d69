"""Records the losses of `port train`'s data-parallel path before port owned its gradient buckets (MindSpore's
``DistributedGradReducer`` under ``set_auto_parallel_context(DATA_PARALLEL, comm_fusion=...)``, commit 1828555),
so tests/train/test_comm_fusion.py can hold the bucketed path to them within 1e-6 (issue 48).

DP 2 under msrun, 20 steps, on stories260K's first layer (tests/conftest.py ``model_dir``), in graph mode and in
PyNative. The reduction sums the same numbers whatever the fusion, so these losses are the reference of every
comm_fusion setting. Run from a checkout of that commit (it writes tests/train/fixtures/dp2_losses.json):

    git worktree add /tmp/before 1828555 && cp tests/train/record_dp2_losses.py /tmp/before/tests/train/
    cd /tmp/before && bash scripts/port.sh && .venv/bin/python tests/train/record_dp2_losses.py OUT.json
"""

from __future__ import annotations

import json
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

STEPS = 20
# micro-batch 2 x DP 2 = 4 of tiny-cpu's 16 windows a step: 4 steps an epoch, 5 epochs (the recipe's) = 20 steps
SETTINGS = ["data.max_seq_length=64", "batching.bucketing.enabled=false", "batching.micro_batch_size=2",
            "batching.grad_accum_steps=1", f"schedule.max_steps={STEPS}", "checkpointing.every_steps=0",
            "checkpointing.export_hf=false", "cluster.devices_per_node=2"]
MODES = ("graph", "pynative")


def record(out: Path) -> dict:
    from porting.cluster.preflight import free_port
    from tests.conftest import _first_layer

    doc: dict = {"settings": SETTINGS, "model": "stories260K's first layer (tests/conftest.py model_dir)",
                 "commit": subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True,
                                          text=True).stdout.strip(),
                 "command": "python tests/train/record_dp2_losses.py OUT.json", "losses": {}}
    with tempfile.TemporaryDirectory() as tmp:
        model = Path(tmp) / "stories1"
        model.mkdir()
        _first_layer(model)
        for mode in MODES:
            run = Path(tmp) / mode
            sets = SETTINGS + [f"model.source={model}", f"execution={mode}", f"cluster.master_port={free_port()}"]
            args = [a for s in sets for a in ("--set", s)]
            subprocess.run([sys.executable, "-m", "porting", "train", str(ROOT / "recipes" / "tiny-cpu.yaml"),
                            "--run-dir", str(run), *args], cwd=ROOT, check=True, capture_output=True, timeout=900)
            rows = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
            doc["losses"][mode] = [r["loss"] for r in rows if r.get("kind", "step") == "step" and "loss" in r]
    out.write_text(json.dumps(doc, indent=1) + "\n")
    return doc


if __name__ == "__main__":
    print(json.dumps(record(Path(sys.argv[1]))["losses"]))
