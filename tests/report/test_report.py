"""`port report RUNDIR` on run directories hand-written in the run-directory format (docs/rundir.md):
manifest.json, plan.json, metrics.jsonl, logs/rank_<r>.log, checkpoints/, hf/, plus evidence files;
and the report's promises: it never replaces a directory port did not write, and bad evidence is
shown as invalid, never as a pass."""

from __future__ import annotations

import json
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from porting.diagnostics.doctor import doctor_report
from porting.report import ReportResult, make_report
from porting.rundir import RunDirError
from porting.train.plan.make import TrainPlan
from tests.train.conftest import tiny_plan


def _ts(t: float) -> str:
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1000):03d}"


def write_run(root: Path, *, world: int = 2, nodes: int = 1, steps: int = 12, fail_rank: int | None = None,
              nan_at: int | None = None, with_evidence: bool = True) -> Path:
    root.mkdir(parents=True)
    manifest = {"versions": doctor_report(environ={})["versions"], "doctor": doctor_report(environ={}),
                "recipe": {"model": {"source": "stories260k"},
                           "cluster": {"device": "cpu", "nodes": nodes, "devices_per_node": world // nodes}},
                "model": {"name": "stories260k"}, "data": {"sha256": "0" * 64, "examples": 16, "truncated": 0},
                "bucketing": {"shapes": [64, 128]}, "seed": 0, "world_size": world,
                "command": ["port", "train", "recipes/tiny-cpu.yaml"], "started": "2026-11-30T01:00:00"}
    (root / "manifest.json").write_text(json.dumps(manifest))
    (root / "plan.json").write_text(json.dumps(_plan(world, nodes).to_dict()))
    t0 = 1_795_000_000.0
    lines = []
    for s in range(1, steps + 1):
        loss = float("nan") if nan_at == s else 3.0 / (1 + 0.2 * s)
        lines.append(json.dumps({"step": s, "loss": loss, "lr": 1e-3, "grad_norm": 0.5, "tokens": 512,
                                 "tokens_per_s": 300.0 if s > 2 else 40.0, "step_time_s": 1.7 if s <= 2 else 0.2,
                                 "padding_fraction": 0.1, "compile": s <= 2, "host_rss_gib": 1.2 + 0.01 * s}))
    if fail_rank is None:
        lines.append(json.dumps({"event": "summary", "compile_time_s": 3.0, "steady_tokens_per_s": 2560.0,
                                 "steady_step_time_s": 0.2}))
    (root / "metrics.jsonl").write_text("\n".join(lines) + "\n")
    logs = root / "logs"
    logs.mkdir()
    for r in range(world):
        out = [f"{_ts(t0)} rank={r} INFO start world_size={world}"]
        last = steps if fail_rank is None else 7
        for s in range(1, last + 1):
            out.append(f"{_ts(t0 + s)} rank={r} INFO step {s}/{steps} loss 1.00000 lr 1.000e-03 grad_norm 0.5 "
                       f"tokens/s 300 step 0.200s pad 0.100")
        if fail_rank is not None:
            msg = ("ERROR RuntimeError: out of memory allocating 2.0 GiB" if r == fail_rank
                   else "ERROR collective AllReduce timed out waiting for peers")
            out.append(f"{_ts(t0 + last + (1 if r == fail_rank else 30))} rank={r} {msg}")
        (logs / f"rank_{r}.log").write_text("\n".join(out) + "\n")
    for s in (steps // 2, steps):
        (root / "checkpoints" / f"step_{s}").mkdir(parents=True)
    (root / "hf").mkdir()
    (root / "hf" / "config.json").write_text("{}")
    if with_evidence:
        (root / "parity.json").write_text(json.dumps({"passed": True, "checks": [
            {"name": "logits", "measure": "max_abs", "value": 2e-6, "tolerance": 1e-4, "passed": True,
             "detail": "max rel 1.0e-03"}]}))
        (root / "ops_scan.json").write_text(json.dumps({"ops": [{"op": "aten::mm"}], "blocking": [],
                                                       "counts": {"registered": 1}}))
    return root


def _plan(world: int, nodes: int) -> TrainPlan:
    """The plan.json `port train` writes for the tiny recipe at that scale."""
    return tiny_plan(f"cluster.nodes={nodes}", f"cluster.devices_per_node={world // nodes}")


def rows_by_item(res: ReportResult) -> dict[str, dict]:
    return {r["item"]: r for r in res.to_dict()["rows"]}


def test_complete_run_fills_every_area(tmp_path):
    res = make_report(write_run(tmp_path / "run"))
    rows = rows_by_item(res)
    assert {r.area for r in res.rows} == {"correctness", "operators", "stability", "communication",
                                                "resources", "performance", "environment"}
    parity = rows["parity with HF (port verify)"]
    assert parity["status"] == "pass" and "logits max abs 2.000e-06 (tolerance 1.0e-04) ok" in parity["value"], parity
    assert rows["training loss"]["status"] == "pass" and "->" in rows["training loss"]["value"]
    assert rows["torch_npu coverage (port ops scan)"]["status"] == "pass"
    assert rows["run at single-node multi-device"]["status"] == "pass"
    assert rows["run at 1 device"]["status"] == "missing" and rows["run at multi-node"]["status"] == "missing"
    assert rows["per-rank logs"]["status"] == "pass" and "2 rank log(s)" in rows["per-rank logs"]["value"]
    assert rows["log diagnosis (port diagnose)"]["status"] == "pass"
    assert rows["peak memory by phase (plan estimate)"]["status"] == "pass"
    total = _plan(2, 1).memory_gib_by_phase.total
    assert f"total {total:.2f} GiB of 64 GiB" in rows["peak memory by phase (plan estimate)"]["value"]
    assert "host_rss_gib 1.32" in rows["measured peak memory"]["value"]
    assert "2560.0 tokens/s" in rows["throughput (steady)"]["value"]
    assert "compile 3.00 s over 2 step(s); steady 0.200 s/step" == rows["compile vs steady"]["value"]
    assert rows["doctor checks"]["status"] == "pass"
    assert rows["rank map (rank table)"]["status"] == "missing"
    assert rows["communication wait"]["status"] == "missing"
    out = res.out
    for name in ("report.html", "report.md", "report.json", "loss.svg", "step_time.svg", "memory.svg"):
        assert (out / name).is_file()
    html = (out / "report.html").read_text()
    assert "http://" not in html.replace("http://www.w3.org/2000/svg", "") and "https://" not in html
    assert html.count("<svg") == 3 and html.count('class="mark"') == 2  # the two compile steps
    md = (out / "report.md").read_text()
    assert "| correctness | training loss | **pass** |" in md


def test_failed_run_and_missing_evidence(tmp_path, shared):
    run = write_run(tmp_path / "run", world=4, nodes=2, fail_rank=3, nan_at=5, with_evidence=False)
    shutil.copy(shared / "data/ascend/rank_tables/mindspore_docs_EI0004_invalid_ranktable_duplicate_device_id.json",
                run / "rank_table.json")
    res = make_report(run)
    rows = rows_by_item(res)
    assert rows["parity with HF (port verify)"]["status"] == "missing"
    assert "port verify" in rows["parity with HF (port verify)"]["evidence"]
    assert rows["torch_npu coverage (port ops scan)"]["status"] == "missing"
    assert rows["training loss"]["status"] == "fail" and "step(s) [5]" in rows["training loss"]["value"]
    assert rows["run at multi-node"]["status"] == "fail" and "did not finish" in rows["run at multi-node"]["value"]
    diag = rows["log diagnosis (port diagnose)"]
    assert diag["status"] == "fail" and "rank 3 failed first at step 7" in diag["value"]
    assert rows["rank map (rank table)"]["status"] == "fail"
    rank_map = rows["rank map (rank table)"]["value"]
    assert "device_id 1 repeats" in rank_map and "cards_per_node=2" in rank_map and "nodes=2" in rank_map


def test_truncated_metrics_line_is_a_note(tmp_path):
    run = write_run(tmp_path / "run")
    with open(run / "metrics.jsonl", "a") as f:
        f.write('{"step": 13, "loss": 0.')  # cut by a kill
    res = make_report(run, tmp_path / "out")
    assert any("1 malformed line(s)" in n for n in res.notes)
    assert (tmp_path / "out" / "report.html").is_file() and not (run / "report").exists()


@pytest.mark.parametrize("make,needle", [
    (lambda p: p / "nope", "no such run directory"),
    (lambda p: (p / "f").write_text("x") and p / "f", "is a file"),
    (lambda p: p, "not a run directory"),
])
def test_bad_run_dirs(tmp_path, make, needle):
    with pytest.raises(RunDirError, match=needle):
        make_report(make(tmp_path))


def test_cli_one_line_error_and_no_partial_output(tmp_path):
    from click.testing import CliRunner

    from porting.cli import main

    r = CliRunner().invoke(main, ["report", str(tmp_path / "missing")])
    assert r.exit_code == 2 and r.output.startswith("error: ") and "no such run directory" in r.output
    run = write_run(tmp_path / "run")
    r = CliRunner().invoke(main, ["report", str(run), "--json"])
    assert r.exit_code == 0, r.output
    assert json.loads(r.output)["out"] == str(run / "report")
    assert not [p for p in run.iterdir() if p.name.startswith(".report.")]
    assert "Examples:" in CliRunner().invoke(main, ["report", "--help"]).output


def test_html_renders_in_headless_chromium(tmp_path):
    chromium = shutil.which("chromium") or shutil.which("chromium-browser") or shutil.which("google-chrome")
    if chromium is None:
        pytest.skip("chromium not installed (apt-get install -y chromium); the HTML is still checked above")
    res = make_report(write_run(tmp_path / "run"))
    page = res.out / "report.html"
    args = [chromium, "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
            f"--user-data-dir={tmp_path / 'profile'}"]
    dom = subprocess.run(args + ["--dump-dom", page.as_uri()], capture_output=True, text=True, timeout=120)
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert dom.stdout.count('<tr class="row') == len(res.rows)
    assert dom.stdout.count("<svg") == 3 and "polyline" in dom.stdout
    shot = tmp_path / "shot.png"
    r = subprocess.run(args + [f"--screenshot={shot}", "--window-size=1200,1600", page.as_uri()],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0 and shot.stat().st_size > 20_000  # a rendered page, not a blank one


@pytest.mark.slow
def test_end_to_end_real_port_train_run(tmp_path, tiny_cpu_run):
    """A real `port train` run (stories260K on TinyStories, 20 steps on this CPU: the session's
    `tiny_cpu_run`, copied), the real ops scan written next to it, then the report: every row that run can
    fill is filled."""
    import shutil

    from tests.helpers import port

    run = tmp_path / "run"
    shutil.copytree(tiny_cpu_run, run)
    res = port("ops", "scan", "--hf", "stories260k", "--out", str(run / "ops_scan.json"))
    assert res.returncode == 0, res.stdout + res.stderr
    rep = make_report(run)
    rows = rows_by_item(rep)
    assert rows["training loss"]["status"] == "pass"
    assert rows["run at 1 device"]["status"] == "pass" and "finished" in rows["run at 1 device"]["value"]
    assert rows["checkpoints"]["status"] == "pass" and rows["HF export"]["status"] == "pass"
    assert rows["torch_npu coverage (port ops scan)"]["status"] == "pass"
    from model_zoo import cpu_kernels

    impl = "cpu" if cpu_kernels.available() else "reference"
    assert f"on CPU (float32): attention={impl}, rope={impl}, rmsnorm={impl}" in rows["MindSpore kernel plan"]["value"]
    assert rows["log diagnosis (port diagnose)"]["status"] == "pass"
    assert rows["peak memory by phase (plan estimate)"]["status"] == "pass"
    assert "tokens/s" in rows["throughput (steady)"]["value"]
    assert rows["compile vs steady"]["value"].startswith("compile ")
    assert rows["versions"]["status"] == "info"
    assert rows["doctor checks"]["status"] != "missing"  # port train writes doctor_report() as "doctor"
    html = (run / "report" / "report.html").read_text()
    assert html.count("<svg") == 3 and "polyline" in html


def test_garbage_run_dir_gives_notes_not_tracebacks(tmp_path):
    run = tmp_path / "run"
    (run / "logs").mkdir(parents=True)
    (run / "manifest.json").write_text("{garbage")
    (run / "metrics.jsonl").write_bytes(bytes(range(256)) * 20)
    (run / "logs" / "rank_0.log").write_bytes(b"\x00\x01\x02" * 1000)
    (run / "logs" / "rank_1.log").write_text("x" * 200_000)  # one huge line, no newline
    res = make_report(run)
    notes = " | ".join(res.notes)
    assert "manifest.json: invalid JSON at line 1" in notes and "metrics.jsonl:" in notes
    assert "rank_0.log: binary content" in notes
    rows = rows_by_item(res)
    assert rows["rank map (rank table)"]["status"] == "missing" and rows["training loss"]["status"] == "missing"


def _snapshot(root: Path) -> dict[Path, bytes]:
    return {p: p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def _report_cli(*args: str):
    from click.testing import CliRunner

    from porting.cli import main

    return CliRunner().invoke(main, ["report", *map(str, args)])


def test_out_never_replaces_what_port_did_not_write(tmp_path):
    """Issue 15 (1): --out equal to, containing or inside the run dir, a model directory, a file or a
    link is refused with one line, exit 2, and nothing is deleted or changed."""
    run = write_run(tmp_path / "runs" / "x")
    model = tmp_path / "model"
    shutil.copytree(Path(__file__).resolve().parents[2] / "model_zoo" / "assets" / "stories260k", model)
    (tmp_path / "afile").write_text("keep me")
    (tmp_path / "link").symlink_to(model)
    before = _snapshot(tmp_path)
    cases = [
        ((run, "--out", run), "is the run directory itself"),
        ((run, "--out", run, "--force"), "is the run directory itself"),
        ((run, "--out", tmp_path / "runs"), "contains the run directory"),
        ((run, "--out", run / "checkpoints", "--force"), "is inside the run directory"),
        ((run, "--out", model), "is not a report port wrote (no .port-report marker)"),
        ((run, "--out", model, "--force"), "is not a report port wrote"),
        ((run, "--out", tmp_path / "afile", "--force"), "exists and is not a directory"),
        ((run, "--out", tmp_path / "link", "--force"), "is a symbolic link"),
    ]
    for args, needle in cases:
        r = _report_cli(*args)
        assert r.exit_code == 2, (args, r.output)
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: ") and needle in lines[0], (args, r.output)
        assert _snapshot(tmp_path) == before, args
        assert sorted(p.name for p in tmp_path.rglob(".*port-tmp*")) == []


def test_an_earlier_report_is_replaced_only_with_force(tmp_path):
    run = write_run(tmp_path / "run")
    out = tmp_path / "rep"
    assert _report_cli(run, "--out", out).exit_code == 0
    assert (out / ".port-report").is_file() and (out / "report.html").is_file()
    (out / "report.md").write_text("stale")
    r = _report_cli(run, "--out", out)
    assert r.exit_code == 2 and "holds an earlier `port report`; pass --force" in r.output
    assert (out / "report.md").read_text() == "stale"
    assert _report_cli(run, "--out", out, "--force").exit_code == 0
    assert (out / "report.md").read_text().startswith("# port report: run")
    # the default RUNDIR/report follows the same rule; an empty directory is free to use
    assert _report_cli(run).exit_code == 0 and _report_cli(run).exit_code == 2
    assert _report_cli(run, "--force").exit_code == 0
    (tmp_path / "empty").mkdir()
    assert _report_cli(run, "--out", tmp_path / "empty").exit_code == 0
    # a forged marker (not port's body) does not make a directory replaceable
    forged = tmp_path / "forged"
    forged.mkdir()
    (forged / ".port-report").write_text("{}")
    (forged / "data.bin").write_bytes(b"precious")
    r = _report_cli(run, "--out", forged, "--force")
    assert r.exit_code == 2 and "no .port-report marker" in r.output and (forged / "data.bin").read_bytes() == b"precious"


@pytest.mark.parametrize("passed", ["false", "true", 1, None, [True]])
def test_passed_must_be_a_real_bool(tmp_path, passed):
    """Issue 15 (6): a truthy non-bool `passed` is shown as invalid (a fail), never as a pass."""
    run = write_run(tmp_path / "run")
    (run / "parity.json").write_text(json.dumps({"passed": passed, "checks": [{"max_abs": "big"}]}))
    row = rows_by_item(make_report(run))["parity with HF (port verify)"]
    assert row["status"] == "fail" and row["value"].startswith("invalid parity.json: 'passed' is"), row


def test_parity_rows_must_be_check_rows(tmp_path):
    """A row of parity.json is the one result row `port verify --json` writes; another shape is invalid (a fail),
    and a failed row is named even when the file says passed."""
    run = write_run(tmp_path / "run")
    (run / "parity.json").write_text(json.dumps({"passed": True, "checks": [{"max_abs": "big"}]}))
    row = rows_by_item(make_report(run))["parity with HF (port verify)"]
    assert row["status"] == "fail" and row["value"].startswith("invalid parity.json: check row field 'name'"), row
    bad = {"name": "loss", "measure": "max_abs", "value": 0.5, "tolerance": 1e-5, "passed": False, "detail": ""}
    (run / "parity.json").write_text(json.dumps({"passed": True, "checks": [bad]}))
    row = rows_by_item(make_report(run, force=True))["parity with HF (port verify)"]
    assert row["status"] == "fail" and "loss max abs 5.000e-01 (tolerance 1.0e-05) FAIL" in row["value"], row


def test_markdown_escapes_html_like_the_html(tmp_path):
    run = write_run(tmp_path / "<script>alert(1)<")
    (run / "ops_scan.json").write_text(json.dumps({"ops": [{"op": "x"}], "blocking": ["<script>alert(2)</script>|x"],
                                                   "counts": {"<img src=x onerror=alert(3)>": 1}}))
    (run / "parity.json").write_text('{"passed": tru')   # its note quotes the file's text
    res = make_report(run, tmp_path / "out")
    md = (res.out / "report.md").read_text()
    page = (res.out / "report.html").read_text()
    for text in (md, page):
        assert "<script" not in text and "<img" not in text, text
    assert "&lt;script&gt;alert(2)&lt;/script&gt;\\|x" in md and "&lt;img src=x onerror=alert(3)&gt;" in md
    assert md.startswith("# port report: &lt;script&gt;alert(1)&lt;\n")
    assert all(line.count(" | ") == 4 for line in md.splitlines() if line.startswith("| ") and "---" not in line)


def test_deep_manifest_is_a_note_in_the_report(tmp_path):
    """Issue 15: a run manifest nested 100,000 levels: one line (a note here; `port compare` refuses it
    with one error line, tests/baseline/test_compare_cli.py), no traceback, the run untouched."""
    run = write_run(tmp_path / "run")
    (run / "manifest.json").write_text("[" * 100_000 + "]" * 100_000)
    before = _snapshot(run)
    r = _report_cli(run, "--out", tmp_path / "out")
    assert r.exit_code == 0, r.output
    assert "note: manifest.json: the JSON nests deeper than 64 levels" in r.output
    assert _snapshot(run) == before


# ------------------------------------------------------------------ the loss plot: the run and the baseline
def write_baseline(path: Path, losses: list[float]) -> Path:
    """A `port baseline` file (format port-baseline v1) with these losses, written by port's one writer."""
    import numpy as np

    from porting.baseline import arrays, document
    from porting.baseline.memory import PHASES

    n = len(losses)
    steps = document.Steps(step=tuple(range(1, n + 1)), loss=tuple(losses), grad_norm=(0.5,) * n, lr=(1e-3,) * n,
                           tokens=(512,) * n, step_time_s=(0.1,) * n, peak_memory_gib={p: (0.1,) * n for p in PHASES})
    settings = document.Settings(global_batch=1, seq_length=2, micro_batch_size=1, grad_accum_steps=1, world_size=1,
                                 dtype="float32", data_sha256="0" * 64, data_order={}, seed=1, steps=n)
    logits = arrays.encode(np.zeros((1, 2, 4), np.float32))
    doc = document.MeasuredBaseline(created="2026-12-01T00:00:00", command=("port", "baseline"),
                                    device={"kind": "cpu", "name": "test cpu"}, versions={}, model={},
                                    settings=settings, steps=steps, timing=document.Timing(), memory=document.Memory(),
                                    probe=document.Probe(input_ids=((1, 2),), after_step=n, logits_initial=logits,
                                                         logits_final=logits))
    return document.save(path, doc)


def _polylines(svg: str) -> dict[str, list[tuple[float, float]]]:
    import re

    out = {}
    for label, pts in re.findall(r'<polyline class="series" data-label="([^"]*)"[^>]*points="([^"]*)"', svg):
        out[label] = [tuple(map(float, p.split(","))) for p in pts.split()]
    return out


def test_loss_plot_draws_the_run_and_the_baseline_on_one_axis(tmp_path):
    run = write_run(tmp_path / "run", steps=12)
    base_losses = [3.2 / (1 + 0.15 * s) for s in range(1, 11)]   # 10 steps, other values than the run's
    write_baseline(run / "baseline.json", base_losses)
    make_report(run)
    svg = (run / "report" / "loss.svg").read_text()
    lines = _polylines(svg)
    assert set(lines) == {"this run (port train)", "baseline (PyTorch, cpu)"}
    assert "this run (port train)</text>" in svg and "baseline (PyTorch, cpu)</text>" in svg   # the legend
    mine, base = lines["this run (port train)"], lines["baseline (PyTorch, cpu)"]
    run_losses = [3.0 / (1 + 0.2 * s) for s in range(1, 13)]
    assert len(mine) == 12 and len(base) == 10
    # One linear map from (step, loss) to pixels for both series: the points are the records' values.
    (xa, ya), (xb, yb) = mine[0], mine[-1]
    kx, ky = (xb - xa) / 11, (yb - ya) / (run_losses[-1] - run_losses[0])
    for pts, losses in ((mine, run_losses), (base, base_losses)):
        for s, ((x, y), loss) in enumerate(zip(pts, losses), 1):
            assert x == pytest.approx(xa + kx * (s - 1), abs=0.2)   # pixels are written to 0.1
            assert y == pytest.approx(ya + ky * (loss - run_losses[0]), abs=0.2)
    assert (run / "report" / "report.html").read_text().count("<polyline") >= 3   # loss (2) + step time


def test_loss_plot_without_a_baseline_has_one_series_and_a_bad_baseline_is_one_line(tmp_path):
    from click.testing import CliRunner

    from porting.cli import main

    run = write_run(tmp_path / "run", steps=6)
    make_report(run)
    assert list(_polylines((run / "report" / "loss.svg").read_text())) == [""]
    bad = tmp_path / "base.json"
    bad.write_text('{"format": "port-baseline"}')
    res = CliRunner().invoke(main, ["report", str(run), "--out", str(tmp_path / "rep"), "--baseline", str(bad)])
    assert res.exit_code != 0 and "Traceback" not in res.output
    line = [x for x in res.output.splitlines() if x.startswith("error:")]
    assert line and str(bad) in line[0] and "port baseline" in line[0], res.output
    assert not (tmp_path / "rep").exists()
