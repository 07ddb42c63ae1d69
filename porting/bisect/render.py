"""The terminal table of a bisection: one line per compared tensor, the first divergent row marked."""

from __future__ import annotations

import click

from porting.verify.check import CELLS_HEADER, Check, cells

_HEAD = f"  {'phase':8} {'layer':>5} {'block':20} {'kernel':16} {'max abs':>10} {'max rel':>10} {'cosine':>10} " \
        f"{'nonfin':>6} {CELLS_HEADER}"


def _num(v) -> str:
    return f"{v:10.3e}" if isinstance(v, (int, float)) else f"{'-':>10}"


def _cos(v) -> str:
    return f"{v:10.8f}" if isinstance(v, (int, float)) else f"{'-':>10}"


def _line(r: dict, mark: str) -> str:
    """Where the tensor sits and its statistics, then its verdict as the one result row's cells."""
    m = r["metrics"] or {}
    layer = "-" if r["layer"] is None else str(r["layer"])
    name = r["tensor"].split(" ")[-1]
    param = r["tensor"].startswith("AdamW") or name.endswith(("weight", "bias"))
    block = "param " + ".".join(name.split(".")[-2:]) if param else r["block"]
    check = Check.from_dict({k: r[k] for k in ("name", "measure", "value", "tolerance", "passed", "detail")})
    return (f"{mark} {r['phase']:8} {layer:>5} {block[:20]:20} {r['kernel'][:16]:16} {_num(m.get('max_abs'))} "
            f"{_num(m.get('max_rel'))} {_cos(m.get('cosine'))} {m.get('nonfinite_ms', '-'):>6} {cells(check, None if m else 'n/a')}")


def _title(rep: dict) -> str:
    if "step" not in rep:
        return (f"bisect {rep['ms']} ({rep['weights']}) against {rep['hf_dir']}: {rep['dtype']}, batch {rep['batch']}, "
                f"loss ms {rep['loss']['ms']:.6f} hf {rep['loss']['hf']:.6f}")
    if rep["step"] is None:
        return f"bisect {rep['run']} against {rep['baseline']}: every logged loss within tolerance"
    return (f"bisect {rep['run']} against {rep['baseline']}: loss first beyond tolerance at step "
            f"{rep['first_failing_loss_step']}; replaying step {rep['step']} from {rep['state']} "
            f"(micro-batches {rep['micro_batches']}, lr run {rep['lr']['run']:.4g} baseline {rep['lr']['baseline']:.4g})")


def render(rep: dict, *, all_rows: bool = False, color: bool | None = None) -> str:
    """The table (every row with ``all_rows``; otherwise rows up to the first divergence and a few
    after it), then the verdict."""
    out = [_title(rep)]
    if not rep["rows"]:
        return "\n".join(out + [rep["verdict"]])
    first = rep["first_nonfinite"] if rep["mode"] == "nan-origin" else rep["first_divergent"]
    out += [f"note: {n}" for n in rep.get("notes", [])]
    out.append(_HEAD)
    hit = None
    for i, r in enumerate(rep["rows"]):
        is_first = first is not None and hit is None and all(r[k] == first[k] for k in ("phase", "layer", "tensor"))
        if is_first:
            hit = i
        if not all_rows and hit is not None and i > hit + 3:
            out.append(f"  ... {len(rep['rows']) - i} more rows (--all-rows shows them)")
            break
        line = _line(r, ">>" if is_first else "  ")
        out.append(click.style(line, fg="red", bold=True) if is_first and color is not False else line)
    out.append(rep["verdict"])
    return "\n".join(out)
