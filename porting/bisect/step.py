"""`port bisect --baseline BASELINE RUNDIR`: the first step whose loss leaves the baseline's tolerance
(or turns non-finite), replayed on both sides from the run's own state, update included.

The loss logged at step f is computed before step f's update, from the weights the first f-1 updates
made. When it is the first to differ, the weights entering step f differ while those entering step
f-1 did not, so the step to replay is k = f-1 (k = f = 1 when the very first loss differs). Both sides
start from the run's checkpoint after k-1 steps (``checkpoints/step_<k-1>``: weights, AdamW moments,
step count; for k = 1 the run's initial weights and zero moments), run step k's micro-batches, taken
from the run's recipe through `port train`'s own data plan (:func:`porting.train.data.batching.build_plan`),
forward and backward, then the update: on the MindSpore side port's own clipping and AdamW
(:class:`porting.train.run.step.cells._Update`, :class:`porting.train.run.step.cells.AdamW`) at the learning rate the run's
recipe gives step k; on the reference side torch's ``clip_grad_norm_`` and ``torch.optim.AdamW`` with
the same moments at the learning rate the baseline's recipe gives it (the baseline's own loop,
:mod:`porting.baseline.torch_loop`). Every forward activation, activation gradient, parameter gradient
and per-parameter update (after - before, phase ``update``) is compared.

What cannot be replayed is refused with the reason, never approximated: a step whose state the run
did not keep, runs over several devices, packed rows, precisions other than float32, a data file that
changed since the run.
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np

from model_zoo.errors import CheckpointError, ConfigError
from porting.baseline.comparison import Comparison   # light: the result records of `port compare`
from porting.train.recipe.schema import Recipe


def _recipe_at(run, k: int):
    """The run's recipe in force at 1-based step k: manifest.json, or the latest manifest_resume_<s>.json
    with s < k (a resumed run may have been given other settings)."""
    from model_zoo.files import read_json_object
    from porting.train import validate_recipe

    path, best = run.path / "manifest.json", 0
    for p in run.path.glob("manifest_resume_*.json"):
        s = p.stem.rsplit("_", 1)[-1]
        if s.isdigit() and best < int(s) < k:
            path, best = p, int(s)
    doc = read_json_object(path, what="run manifest", error=ConfigError)
    return validate_recipe(doc.get("recipe"), str(path), None, check_files=False), doc, path


def _refuse_unreplayable(recipe: Recipe, where: Path) -> None:
    why = []
    if recipe.cluster.nodes * recipe.cluster.devices_per_node > 1:
        why.append("it ran on several devices (replay runs one process; set cluster.devices_per_node: 1)")
    if recipe.batching.packing:
        why.append("it packs rows (the torch reference has no per-example attention; batching.packing: false)")
    if (recipe.precision.param_dtype, recipe.precision.compute_dtype) != ("float32", "float32"):
        why.append("its precision is not float32 (master weights and loss scaling are not replayed)")
    if why:
        raise ConfigError(f"{where}: this run cannot be replayed: " + "; ".join(why))


def first_failing_step(rep: Comparison) -> int | None:
    """The first step of `port compare`'s loss curve beyond tolerance or non-finite (1-based), or None."""
    fails = rep.loss.failing_steps
    return int(fails[0]) if fails else None


def _state(run_dir: Path, k: int, model, opt) -> tuple[int, str]:
    """Load the state entering step k into ``model`` and ``opt``; (AdamW steps done, where from)."""
    from porting.train.run.checkpoint import save as ckpt

    root = run_dir / "checkpoints"
    d = root / f"step_{k - 1}"
    if not (d / ckpt.LAYOUT_FILE).is_file():
        kept = [p.name for _, p in ckpt.checkpoint_dirs(root)] if root.is_dir() else []
        raise CheckpointError(f"{d}: not in the run (kept: {', '.join(kept) or 'none'}); replaying step {k} needs "
                              f"the state after step {k - 1}: set checkpointing.every_steps: 1 and "
                              f"checkpointing.keep_last >= {k} in the recipe and train again")
    st = ckpt.load_whole(d, list(model.trainable_params()) + list(opt.m) + list(opt.v))
    return st.adam_t, str(d)


def _hf_model(hf_dir: Path, weights: dict[str, np.ndarray], table: dict):
    """HF transformers' model of the run's architecture holding exactly the zoo model's weights."""
    import torch

    from converters import names
    from porting.verify.pair import load_reference

    model = load_reference(hf_dir, "float32").train()
    with torch.no_grad():
        for n, p in model.named_parameters():
            p.copy_(torch.from_numpy(weights[names.map_name(n, table)]))
    return model


def _torch_update(base_recipe, lr: float, adam_t: int, moments: dict, table: dict, name_of=None):
    """The baseline loop's update of step k on the HF model: its clipping and torch.optim.AdamW holding
    the run's moments, at the baseline recipe's learning rate; per trainable parameter (zoo names) after - before."""
    def update(model) -> dict[str, np.ndarray]:
        import torch

        from converters import names
        from porting.baseline.runner import optim_config
        from porting.baseline.torch_loop import LoopConfig, make_optimizer

        opt_cfg = optim_config(base_recipe, 1)
        optimizer = make_optimizer(model, opt_cfg, LoopConfig(device="cpu", dtype="float32"))
        zoo = name_of or (lambda n: names.map_name(n, table))
        named = {p: zoo(n) for n, p in model.named_parameters() if p.requires_grad}
        for p, ms_name in named.items():
            m, v = moments[ms_name]
            optimizer.state[p] = {"step": torch.tensor(float(adam_t)), "exp_avg": torch.from_numpy(m.copy()),
                                  "exp_avg_sq": torch.from_numpy(v.copy())}
        for g in optimizer.param_groups:
            g["lr"] = lr
        before = {p: p.detach().clone() for p in named}
        torch.nn.utils.clip_grad_norm_(list(named), opt_cfg.grad_clip if opt_cfg.grad_clip else math.inf)
        optimizer.step()
        return {named[p]: (p.detach() - b).numpy() for p, b in before.items()}
    return update


def _ms_update(recipe: Recipe, opt, lr: float, adam_t: int):
    """`port train`'s update of step k: port's clipping and AdamW (porting.train.run.step.cells), at the run
    recipe's learning rate; per parameter after - before."""
    def update(params, grads) -> dict[str, np.ndarray]:
        import mindspore as ms

        from porting.train.run.step.cells import _Update

        b1, b2 = recipe.optimizer.betas
        t = adam_t + 1
        f32 = lambda x: ms.Tensor(np.float32(x))  # noqa: E731
        before = {p.name: p.asnumpy().copy() for p in params}
        _Update(opt, 1, recipe.optimizer.grad_clip).update(tuple(grads), f32(1.0), f32(lr), f32(1 - b1 ** t),
                                                           f32(1 - b2 ** t))
        return {p.name: p.asnumpy() - before[p.name] for p in params}
    return update


def _plans(recipe: Recipe, base_recipe: Recipe, hf_dir: Path, run_doc: dict, where: Path):
    """`port train`'s data plan for the run's recipe (and the baseline recipe's step count)."""
    from porting.tokenizer import load_tokenizer
    from porting.train import build_plan
    from porting.train import recipe_dict

    tok = load_tokenizer(hf_dir)
    plan = build_plan(recipe, tok)
    recorded = (run_doc.get("data") or {}).get("sha256")
    if recorded != plan.data.report.sha256:
        raise ConfigError(f"{where}: data.sha256 {str(recorded)[:12]}... recorded, {recipe.data.path} now hashes to "
                          f"{plan.data.report.sha256[:12]}...; the data changed since the run, so step batches "
                          "cannot be rebuilt (restore the file the run read)")
    same = all(recipe_dict(recipe)[k] == recipe_dict(base_recipe)[k] for k in ("data", "batching", "schedule"))
    base_total = plan.total_steps if same else build_plan(base_recipe, tok).total_steps
    return plan, base_total


def bisect_step(baseline_path: str, run_dir: str, *, allow_settings_mismatch: bool = False,
                **tol: float | None) -> dict:
    """The step-form report: `port compare`'s first failing step, the replayed step and its rows."""
    from converters import names
    from model_zoo import LlamaConfig
    from porting.baseline import document
    from porting.baseline.compare import run_compare
    from porting.bisect.run import compare_runs, report
    from porting.rundir import read_run
    from porting.train import validate_recipe
    from porting.train.recipe.schedule import lr_at
    from porting.train.run.step.cells import AdamW
    from porting.verify.pair import build_zoo, load_zoo

    base = document.load(baseline_path)
    if not isinstance(base, document.MeasuredBaseline):   # an imported (log-only) baseline has no step to replay
        raise ConfigError(f"{baseline_path}: an imported CUDA log (`port baseline --import`) holds the loss curve only, "
                          "not the per-step state a replay needs; run `port compare` without --bisect for the curve "
                          "gate, or bisect against a baseline measured with `port baseline --recipe`")
    if base.recipe is None:
        raise ConfigError(f"{baseline_path}: holds no 'recipe' (the resolved recipe `port baseline run` writes), so "
                          "the baseline's side of the step cannot be replayed; re-create it with `port baseline run`")
    rep = run_compare(baseline_path, run_dir, allow_settings_mismatch=allow_settings_mismatch, probe=False, **tol)
    assert isinstance(rep, Comparison), "a measured baseline gives a per-step comparison"
    f = first_failing_step(rep)
    head = {"baseline": str(baseline_path), "run": str(run_dir), "failing_steps": list(rep.loss.failing_steps[:10])}
    if f is None:
        return {**head, "step": None, "mode": "divergence", "rows": [], "first_divergent": None, "first_nonfinite": None,
                "verdict": "no step beyond tolerance: nothing to bisect"}
    k = max(f - 1, 1)
    run = read_run(run_dir)
    recipe, run_doc, mpath = _recipe_at(run, k)
    base_recipe = validate_recipe(base.recipe, str(baseline_path), None, check_files=False)
    for r, where in ((recipe, mpath), (base_recipe, Path(baseline_path))):
        _refuse_unreplayable(r, where)
    hf_dir = Path(run_doc["model"]["dir"])
    cfg = LlamaConfig.from_hf(hf_dir)
    plan, base_total = _plans(recipe, base_recipe, hf_dir, run_doc, mpath)
    step = plan.step(k - 1, 0)
    if recipe.lora is not None:   # the adapters over the frozen base, on both sides (porting/bisect/lora.py)
        from porting.bisect import lora as bisect_lora
        from porting.train.recipe.adapter import targets as lora_targets

        model, found = bisect_lora.zoo_model(recipe, cfg, hf_dir, run.path, k), lora_targets(recipe, cfg)
    else:
        model = load_zoo(hf_dir, cfg=cfg) if k == 1 else build_zoo(cfg)
    params = list(model.trainable_params())
    o = recipe.optimizer
    opt = AdamW(params, tuple(o.betas), o.eps, o.weight_decay)
    if k == 1:
        adam_t, state = 0, f"{hf_dir} (the run's initial weights{', its adapter_init' if recipe.lora else ''}, zero moments)"
    else:
        adam_t, state = _state(run.path, k, model, opt)
    table = names.NAME_MAPS[cfg.model_type]
    weights = {p.name: p.asnumpy().copy() for p in params}
    moments = {p.name: (m.asnumpy().copy(), v.asnumpy().copy()) for p, m, v in zip(params, opt.m, opt.v)}
    lr = {"run": lr_at(recipe, k - 1, plan.total_steps), "baseline": lr_at(base_recipe, k - 1, base_total)}
    micro = [(mb.input_ids, mb.labels) for mb in step.micro_batches]
    name_of = bisect_lora.name_of(found, table) if recipe.lora is not None else None
    hf = (lambda: bisect_lora.hf_model(recipe, hf_dir, weights, found, table)) if recipe.lora is not None else (
        lambda: _hf_model(hf_dir, weights, table))
    comp, out = compare_runs(hf, model, micro, step.global_tokens, "float32",
                             ref_update=_torch_update(base_recipe, lr["baseline"], adam_t, moments, table, name_of),
                             ms_update=_ms_update(recipe, opt, lr["run"], adam_t), name_of=name_of,
                             frozen=bisect_lora.FROZEN if recipe.lora is not None else None)
    res = report(sorted(comp.rows.values(), key=lambda r: r.order), **head, step=k, first_failing_loss_step=f,
                 state=state, recipe=str(mpath), lr=lr, micro_batches=[list(mb.shape) for mb in step.micro_batches],
                 tokens=step.global_tokens, kernels=model.plan.as_dict(), **out)
    res["verdict"] = f"step {k}: " + res["verdict"]
    if res["first_divergent"] is not None:
        res["first_divergent"]["step"] = k
    return res
