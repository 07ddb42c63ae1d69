"""`port intake DIR --out MIGRATION_DIR`: a CUDA job's folder in, a migration folder out.

DIR is searched (symbolic links not followed, at most MAX_FILES files, MAX_DEPTH levels) for the three
kinds of material a team brings: configs (``training_args.bin``, TrainingArguments/DeepSpeed JSON,
LLaMA-Factory/accelerate YAML), a loss log (``trainer_state.json`` with the most steps, else
``trainer_log.jsonl``, TensorBoard events, a CSV) and Python scripts. MIGRATION_DIR gets the recipe
(:mod:`recipe_import`) with its key mapping, the imported baseline (:mod:`baseline_import`, with the
recipe's global batch and sequence length as the stated settings), the script scan (:mod:`script_scan`)
and a README of what to run next. It is written whole or not at all (``converters.atomic.staged_dir``)
and never over a directory that is not empty.
"""

from __future__ import annotations

import json
import os
import shlex
from pathlib import Path
from typing import Any

from converters import atomic
from model_zoo import files
from model_zoo.errors import PortingError, one_line
from porting.intake import IntakeError
from porting.intake.typed import name as shown
from porting.intake.recipe_import import Target

MAX_FILES = 5_000
MAX_DEPTH = 6
LOG_ORDER = ("trainer_state.json", "trainer_log.jsonl", "tfevents", ".csv")
NOT_CONFIGS = {"config.json", "generation_config.json", "tokenizer_config.json", "special_tokens_map.json",
               "all_results.json", "train_results.json", "eval_results.json",
               "trainer_state.json", "preprocessor_config.json", "added_tokens.json", "tokenizer.json", "vocab.json"}


def walk(root: Path) -> list[Path]:
    """Files under ``root``, sorted, links not followed, bounded in count and depth."""
    if not root.is_dir():
        raise IntakeError(f"{root}: not a directory; pass the CUDA job's folder (configs, logs, scripts)")
    out: list[Path] = []
    for d, dirs, names in os.walk(root, followlinks=False):
        depth = len(Path(d).relative_to(root).parts)
        dirs[:] = sorted(x for x in dirs if not x.startswith(".") and depth < MAX_DEPTH)
        out += [Path(d) / n for n in sorted(names) if not (Path(d) / n).is_symlink()]
        if len(out) > MAX_FILES:
            raise IntakeError(f"{root}: more than {MAX_FILES:,} files; point port intake at the job's own folder "
                              "(configs, logs, scripts), not a dataset or an environment")
    return out


def pick_log(found: list[Path], events: bool = False) -> Path | None:
    """The training log to import: trainer_state.json with the most steps, else the first of LOG_ORDER;
    with ``events`` (a --loss-tag was given), the first TensorBoard event file when there is one."""
    tb = [p for p in found if "tfevents" in p.name]
    if events and tb:
        return tb[0]
    states = [p for p in found if p.name == "trainer_state.json"]
    if states:
        def steps(p: Path) -> int:
            try:
                g = files.read_json(p, what="trainer_state.json", max_bytes=256 << 20).get("global_step", 0)
            except (PortingError, AttributeError):
                return -1
            return g if isinstance(g, int) else -1
        return max(states, key=lambda p: (steps(p), -len(p.parts)))
    for marker in LOG_ORDER[1:]:
        hits = [p for p in found if p.name.endswith(marker) or (marker == "tfevents" and "tfevents" in p.name)]
        if hits:
            return hits[0]
    return None


def pick_configs(found: list[Path], notes: list[str]) -> list[Path]:
    from porting.intake.recipe_import import read_config

    out = []
    for p in found:
        if p.name in NOT_CONFIGS or p.suffix not in (".json", ".yaml", ".yml", ".bin") or (
                p.suffix == ".bin" and p.name != "training_args.bin"):
            continue
        try:
            read_config(p)
        except PortingError as e:
            notes.append(f"not used as a config: {e}")
            continue
        out.append(p)
    return out


def run_intake(src: str | Path, out: str | Path, target: Target, loss_tag: str | None = None) -> dict[str, Any]:
    """Run the three imports on ``src`` and write the migration folder ``out``; the summary. ``loss_tag``
    names the loss scalar of a TensorBoard log (``port baseline --import --loss-tag``); a log port cannot
    read (no loss it recognises, damaged) is a note, and the migration is made without a baseline."""
    from porting.intake import baseline_import, recipe_import, script_scan

    root, dest = Path(src), Path(out)
    if dest.resolve() == root.resolve() or root.resolve() in dest.resolve().parents:
        raise IntakeError(f"{shown(dest)}: inside the job folder {shown(root)}; choose an --out outside it")
    # the converters' rule: a new path or an empty directory, never a link, never holding the job
    atomic.check_out(dest, inputs=[root], force=None, error=IntakeError)
    found = walk(root)
    notes: list[str] = []
    configs, log = pick_configs(found, notes), pick_log(found, events=loss_tag is not None)
    scripts = [p for p in found if p.suffix == ".py"]
    summary: dict[str, Any] = {"format": "port-intake", "format_version": 1, "job": str(root), "out": str(dest),
                               "configs": [str(p) for p in configs], "log": str(log) if log else None,
                               "scripts": [str(p) for p in scripts], "notes": notes}
    with atomic.staged_dir(dest, force=False) as tmp:
        rep = None
        if configs:
            rep = recipe_import.import_configs([str(p) for p in configs], tmp / "recipe.yaml", target)
            summary["recipe"] = {"global_batch": rep["global_batch"], "plan": rep["plan"], "model": rep["model"],
                                 "blocking": [f"{r['key']}: {r['reason']}" for r in rep["blocking"]]}
        if log:
            stated = _stated(tmp / "recipe.yaml", rep, target)
            side = _cuda_side(found, configs, log, notes)
            try:
                _, doc = baseline_import.import_log(log, tmp / "baseline.json", stated, ["port", "intake", str(root)],
                                                    loss_tag, effective=side)
            except IntakeError as e:   # as for configs: the rest of the migration is still made, with the reason
                notes.append(f"not used as the loss log: {e}")
                summary["log"] = None
            else:
                summary["baseline"] = {"points": len(doc.steps.step), "format": doc.imported.format_name,
                                       "lacks": list(doc.imported.lacks)}
        scan = script_scan.scan([str(p) for p in scripts]) if scripts else None
        if scan is not None:
            files.write_atomic(tmp / "script_scan.json", json.dumps(scan, indent=1) + "\n", error=IntakeError)
            summary["scan"] = {"files": len(scan["files"]), "findings": len(scan["findings"]), "counts": scan["counts"]}
        files.write_atomic(tmp / "intake.json", json.dumps(summary, indent=1) + "\n", error=IntakeError)
        files.write_atomic(tmp / "README.md", readme(summary, dest), error=IntakeError)
    return summary


def read_cuda_job(folder: str | Path) -> dict:
    """The CUDA side of the settings table from a job folder, its files found as :func:`run_intake` finds them
    (`port compare --cuda-job DIR`); one IntakeError line when it holds no training config."""
    from porting.intake.effective import read_files

    found = walk(Path(folder))
    notes: list[str] = []
    configs = pick_configs(found, notes)
    if not configs:
        raise IntakeError(f"{shown(Path(folder))}: no training config (training_args.bin, TrainingArguments/DeepSpeed "
                          "JSON, LLaMA-Factory/accelerate YAML) to read the CUDA job's settings from"
                          + (f"; {notes[0]}" if notes else ""))
    first = {n: next((p for p in found if p.name == n), None) for n in ("tokenizer_config.json", "config.json")}
    return read_files(configs, pick_log(found), first["tokenizer_config.json"], first["config.json"])


def _cuda_side(found: list[Path], configs: list[Path], log: Path, notes: list[str]) -> dict | None:
    """The CUDA job's effective settings (porting/intake/effective.py) for the baseline's settings table; a file that
    cannot be read for them is a note, and the baseline is made without them."""
    from porting.baseline.effective import side_to_dict
    from porting.intake.effective import read_files

    first = {n: next((p for p in found if p.name == n), None) for n in ("tokenizer_config.json", "config.json")}
    try:
        return side_to_dict(read_files(configs, log, first["tokenizer_config.json"], first["config.json"]))
    except PortingError as e:
        notes.append(f"effective settings not read: {e}")
        return None


def _stated(recipe_path: Path, rep: dict | None, target: Target):
    """What the recipe knows of the CUDA run and its log does not: global batch, sequence length, precision."""
    import yaml

    from porting.intake.baseline_import import Stated

    if rep is None:
        return Stated(model=target.model, devices=target.source_gpus)
    rec = yaml.safe_load(recipe_path.read_text())
    prec = (rec["precision"]["param_dtype"], rec["precision"]["compute_dtype"])
    dtype = {("bfloat16", "bfloat16"): "bfloat16", ("float16", "float16"): "float16"}.get(prec, "float32")
    return Stated(global_batch=rep["global_batch"]["value"], seq_length=rec["data"]["max_seq_length"], dtype=dtype,
                  devices=target.source_gpus)


def readme(s: dict[str, Any], dest: Path) -> str:
    """What was found, what was made, and the commands to run next."""
    lines = [f"# Migration of {_line(s['job'])}", "", "Made by `port intake`; `intake.json` has the same facts.", ""]
    if "recipe" in s:
        r = s["recipe"]
        lines += ["## Recipe", f"`recipe.yaml` from {len(s['configs'])} config(s); every key and what it became: "
                  "`recipe.mapping.json`.", f"Global batch {r['global_batch']['value']} ({r['global_batch']['source']}) "
                  f"-> {r['global_batch']['target']}; {r['plan']['world_size']} devices, "
                  f"{r['plan']['memory_gib_per_device']:.1f} GiB per device planned.", ""]
        lines += [f"- REFUSED (port cannot reproduce it): {_line(b)}" for b in r["blocking"]] + [""]
    else:
        lines += ["## Recipe", "No training config found (training_args.bin, TrainingArguments/DeepSpeed JSON, "
                  "LLaMA-Factory/accelerate YAML): write one with `port recipe import` or by hand (recipes/).", ""]
    if "baseline" in s:
        b = s["baseline"]
        lines += ["## Baseline", f"`baseline.json`: {b['points']} logged points of {_line(s['log'])} ({b['format']}); "
                  f"it lacks {', '.join(b['lacks'])}.", ""]
    else:
        lines += ["## Baseline", "No loss log found: record one with `port baseline run --recipe recipe.yaml` on a CUDA machine.", ""]
    if "scan" in s:
        c = s["scan"]
        lines += ["## Scripts", f"`script_scan.json`: {c['findings']} CUDA habit(s) in {c['files']} script(s): "
                  + (", ".join(f"{k} {v}" for k, v in c["counts"].items()) or "none") + " (`port ops lint` prints the table).", ""]
    # every value from the job (the model's path, the folders) is quoted for the shell: a folder named
    # `m$(touch PWNED)` stays a name when the block is copied into a terminal
    q = {k: shlex.quote(v) for k, v in (("model", str(s.get("recipe", {}).get("model", "MODEL_DIR"))),
                                         ("recipe", f"{dest}/recipe.yaml"), ("base", f"{dest}/baseline.json"),
                                         ("scan", f"{dest}/script_scan.json"))}
    lines += ["## Next", "```bash",
              f"port convert --hf {q['model']} --out ./model-ms   # the checkpoint for MindSpore",
              f"port train {q['recipe']} --dry-run                   # memory by phase, the msrun commands",
              f"port train {q['recipe']} --run-dir runs/migrated",
              f"port compare {q['base']} runs/migrated            # the curve gate against the CUDA log",
              f"cp {q['scan']} runs/migrated/ && port report runs/migrated --baseline {q['base']}",
              "```", ""]
    lines += [f"- note: {_line(n)}" for n in s["notes"]]
    return "\n".join(lines) + "\n"


def _line(text: str) -> str:
    """A value from the job as Markdown text: one line, every Markdown character literal (the report's
    escaping: a newline in a name cannot start a heading or a code block, a link cannot become live)."""
    from porting.report.render import md_text

    return md_text(one_line(text))
