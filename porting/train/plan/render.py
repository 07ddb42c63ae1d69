"""The dry-run plan as text (``port train --dry-run``); ``--json`` is :meth:`TrainPlan.to_dict`."""

from __future__ import annotations

from porting.train.plan import calibrated, roofline
from porting.train.plan.checkpoint_io import gib_text
from porting.train.plan.estimates import CalibratedStep
from porting.train.plan.make import TrainPlan
from porting.train.plan.memory_terms import TERMS


def format_plan(plan: TrainPlan) -> str:
    mem = plan.memory_gib_by_phase
    prec = plan.precision
    lines = [
        f"model: {plan.model.parameters / 1e9:.3f} B parameters, {plan.model.num_hidden_layers} layers",
        f"world size: {plan.hardware} = {plan.tensor_parallel} tensor parallel x {plan.data_parallel} data parallel"
        + (" (no sequence parallel)" if plan.tensor_parallel > 1 and not plan.sequence_parallel else ""),
        f"global batch: {plan.global_batch} = {plan.global_batch_formula}; up to "
        f"{plan.max_tokens_per_step} tokens per step at seq {plan.max_seq_length}",
        f"precision: params {prec.param_dtype}, compute {prec.compute_dtype}, "
        f"loss scale {prec.loss_scale.kind}; recompute {plan.recompute}; "
        f"optimizer sharding {plan.sharding.how}",
        f"training: {plan.training}",
        f"mixed precision: {plan.mixed_precision}",
        f"execution: {plan.execution}",
        "memory per device (GiB):",
    ]
    for k, (formula, source) in TERMS.items():
        used = ""
        if k == "activations" and plan.recompute or k == "activations_recompute" and not plan.recompute:
            used = "  (not used)"
        lines.append(f"  {k:<22} {mem.term(k):>9.2f}{used}  = {formula} [{source}]")
    lines.append(f"  {'peak forward/backward':<22} {mem.peak_forward_backward:>9.2f}  "
                 f"(resident terms + activations + gradients + working set + SwiGLU copies; ZeRO-2: + bucket concat)")
    lines.append(f"  {'peak update':<22} {mem.peak_apply:>9.2f}  "
                 f"(resident terms + fp32 and clip gradients + apply copy + ZeRO buffers + AdamW temporaries)")
    verdict = "fits" if plan.fits else "DOES NOT FIT"
    lines.append(f"  {'total (larger peak)':<22} {mem.total:>9.2f} of {plan.usable_hbm_gib:g} GiB usable "
                 f"({plan.device_hbm_gib:g} GiB HBM) per device: {verdict}, margin {plan.margin_gib:.2f} GiB")
    lines += [f"  change: {s}" for s in plan.suggestions]
    hm = plan.host_memory
    limit = f" of cluster.host_memory_gib {hm.limit_gib:g}" if hm.limit_gib is not None else ""
    lines.append(f"host RAM (predicted peak): {hm.worker_gib:.2f} GiB per worker, {hm.node_gib:.2f} GiB "
                 f"per node{limit} ({hm.formula})")
    if plan.proposals:
        what = "layouts that fit" if plan.fits else "working settings"
        how = ("calibrated estimate, porting/train/plan/calibrated.py" if isinstance(plan.estimated_step, CalibratedStep)
               else "roofline estimate, porting/train/plan/roofline.py")
        lines.append(f"{what} at the same global batch, fastest first ({how}):")
        lines += [f"  {i + 1}. {roofline.proposal_line(p)}" for i, p in enumerate(plan.proposals)]
    if plan.estimated_step is not None:
        lines += calibrated.step_line(plan.estimated_step, plan.links)
    if plan.throughput is not None:
        lines.append(calibrated.throughput_line(plan.throughput))
    lines += [f"warning: {w}" for w in plan.warnings]
    lines += _collective_lines(plan)
    ga = plan.gradient_allreduce
    if ga.allreduce_ops and not plan.sharding.enabled:
        lines.append(f"gradient all-reduce: {ga.gradients} gradients in {ga.allreduce_ops} AllReduce op(s), "
                     f"largest bucket {max(ga.bucket_mib)} MiB ({ga.how})")
    lines += _checkpoint_lines(plan)
    if ga.allreduce_ops and ga.exposed_fraction is not None:
        lines.append(f"exposed communication the step estimate assumes: {ga.exposed_fraction:.0%} of the "
                     f"collectives' time ({ga.exposed_source})")
    if plan.launch is not None:
        lines.append("env on every node: " + " ".join(f"{k}={v}" for k, v in plan.launch.env.items())
                     + f" (predicted checkpoint save {plan.launch.predicted_save_s} s; {plan.launch.formula})")
        lines.append("must match on every node: " + ", ".join(plan.launch.same_on_every_node))
    lines += [f"node {i}: {cmd}" for i, cmd in enumerate(plan.msrun_commands)]
    return "\n".join(lines)


def _checkpoint_lines(plan: TrainPlan) -> list[str]:
    """Restore, disk, save overhead and the supervisor's allowances, each with its formula."""
    a, out = plan.allowances, []
    restore = next((p for p in a.phases if p.name == "restore"), None)
    if restore is not None:
        out.append(f"restore (a resume): {restore.whole_s:.0f} s, every rank reading {a.restore_read_bytes / (1 << 30):.2f} "
                   "GiB at once (its TP slice of the weights and its share of the optimizer states; "
                   f"porting/train/plan/checkpoint_io.py): {restore.inputs}")
    if plan.disk is not None:
        d = plan.disk
        out.append(f"disk (the run directory's filesystem): {gib_text(d.need_gib)} at the peak, during {d.peak_during} "
                   f"(checkpoint {gib_text(d.checkpoint_gib)}, keep_last {d.keep_last}, {d.checkpoints_at_peak} at once; "
                   f"HF export {gib_text(d.hf_export_gib)}; {d.formula}); `port doctor --cluster` checks it")
    if plan.save_overhead is not None:
        so = plan.save_overhead
        share = f"{so.share:.1%} of wall time" if so.share is not None else "share unknown"
        out.append(f"save overhead: {so.save_s:.1f} s a save, {share} ({so.formula})")
    ph = " ".join(f"{p.name} {p.allowance_s} s," for p in a.phases)
    out.append(f"supervisor allowances without a sign of life (--supervise), per phase: {ph.rstrip(',')} (setup = "
               f"max(init, hf_load) = {a.setup_s} s; {a.graphs} graph(s), at most {a.shapes} shape(s), all of them "
               f"{a.compile_total_s} s with the margin; each: {a.formula})")
    return out


def _collective_lines(plan: TrainPlan) -> list[str]:
    if not plan.collectives:
        return []
    mib = lambda b: f"{b / (1 << 20):,.1f} MiB"  # noqa: E731
    cb = plan.collective_bytes
    out = [f"collectives per step per rank: payload {mib(cb.payload_bytes)}, wire {mib(cb.wire_bytes)} "
           f"(data parallel {mib(cb.dp_wire_bytes)}, tensor parallel {mib(cb.tp_wire_bytes)}); "
           + plan.collective_convention]
    est = plan.estimated_step
    figures = est.comm_figures if est is not None and len(est.comm_figures) == len(plan.collectives) else ()
    for i, c in enumerate(plan.collectives):
        out.append(f"  {c.op:<13} x{c.count:<5} {c.group} of {c.ranks:<3} payload {mib(c.payload_bytes):>14}  wire "
                   f"{mib(c.wire_bytes):>14}  {c.purpose}"
                   + (f"; priced {figures[i].seconds:.4f} s: {figures[i].figure}" if figures else ""))
    if figures:
        kinds = sorted({f.basis for f in figures})
        out.append(f"  collective figures: {', '.join(f'{sum(f.basis == k for f in figures)} {k}' for k in kinds)} "
                   "(porting/train/plan/comm_price.py)")
    return out
