"""`port ops scan|zoo`: operator coverage of a model on Ascend (torch_npu side and MindSpore side); `port ops lint`:
CUDA habits in training scripts (parsed, never run). `port ops scan --script` still works, with a note."""

from __future__ import annotations

import json
from pathlib import Path

import click


@click.group("ops", epilog="""\b
Examples:
  port ops scan --hf stories260k
  port ops scan --hf ./my-llama --attn eager --json > ops.json
  port ops scan --hf llama-7b --meta --json   # config only, meta tensors, no weights
  port ops scan --module mypkg.models:build   # factory returning (model, inputs)
  port ops zoo --hf stories260k --device Ascend
  port ops zoo --hf llama-7b --device CPU --json
  port ops lint ./train.py ./patches/ --json""")
def command() -> None:
    """Which operators a model needs and how each maps onto Ascend."""


@command.command("scan", epilog="""\b
Examples:
  port ops scan --hf stories260k
  port ops scan --hf llama-7b --meta --json
  port ops scan --module tests.diagnostics.unsupported_model:build""")
@click.option("--hf", "hf", help="HF model directory or zoo name (real weights if present, else meta).")
@click.option("--script", "scripts", multiple=True, metavar="PATH", hidden=True,
              help="The old spelling of `port ops lint PATH...` (still works, with a note).")
@click.option("--module", "module", help="Python entry point package.module:factory -> (model, inputs dict).")
@click.option("--meta", is_flag=True, help="Build the model on meta tensors (no weights, any size).")
@click.option("--attn", type=click.Choice(["sdpa", "eager"]), default="sdpa", show_default=True,
              help="HF attention implementation to trace.")
@click.option("--batch", type=click.IntRange(min=1), default=2, show_default=True)
@click.option("--seq", type=click.IntRange(min=2), default=16, show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print the scan as JSON.")
@click.option("--out", type=click.Path(path_type=Path), help="Also write the JSON to this file.")
def scan_cmd(hf, scripts, module, meta, attn, batch, seq, as_json, out) -> None:
    """Run forward, backward and one AdamW step on CPU (or meta) tensors, record every aten overload
    with shapes, dtypes and phase, and classify it against the torch_npu registry."""
    from porting.diagnostics import DiagnosticsError

    if sum(map(bool, (hf, module, scripts))) != 1:
        raise DiagnosticsError("ops scan: give exactly one of --hf DIR|NAME or --module package.module:factory "
                               "(training scripts: port ops lint PATH...)")
    _check_out(out, scripts)
    if scripts:
        click.echo("note: `port ops scan --script PATH` is now `port ops lint PATH...`", err=True)
        _lint(scripts, as_json, out)
        return
    from porting.diagnostics import opscan

    if hf:
        model, inputs, device = opscan.load_hf(hf, meta=meta, attn=attn, batch=batch, seq=seq)
        source = str(hf)
    else:
        model, inputs, device = opscan.load_entry_point(module)
        source = module
    result = opscan.scan(model, inputs, source=source, device=device)
    _write_json(out, result)
    click.echo(json.dumps(result, indent=2) if as_json else opscan.render_scan(result))


@command.command("zoo", epilog="""\b
Examples:
  port ops zoo --hf stories260k --device Ascend
  port ops zoo --hf llama-7b --device Ascend --dtype bfloat16 --per-layer
  port ops zoo --hf ./my-llama --device CPU --json""")
@click.option("--hf", "hf", required=True, help="HF model directory or zoo name.")
@click.option("--device", type=click.Choice(["Ascend", "CPU", "GPU"]), default="Ascend", show_default=True)
@click.option("--dtype", "dtype", type=click.Choice(["bfloat16", "float16", "float32"]), default="bfloat16",
              show_default=True, help="Compute dtype (the fused attention takes fp16/bf16 only).")
@click.option("--per-layer", is_flag=True, help="One row per layer and kernel instead of a compact plan.")
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON.")
def zoo_cmd(hf, device, dtype, per_layer, as_json) -> None:
    """The MindSpore side: which kernel (fused Ascend op or reference composition) each layer gets."""
    from porting.diagnostics import opscan

    d = opscan.zoo_report(hf, device=device, compute_dtype=dtype)
    click.echo(json.dumps(d, indent=2) if as_json else opscan.render_zoo(d, compact=not per_layer))


@command.command("lint", epilog="""\b
Examples:
  port ops lint ./train.py
  port ops lint ./train.py ./patches/ --json
  port ops lint ./job/ --out migration/script_scan.json""")
@click.argument("paths", nargs=-1, required=True)
@click.option("--json", "as_json", is_flag=True, help="Print the findings as JSON.")
@click.option("--out", type=click.Path(path_type=Path), help="Also write the JSON to this file.")
def lint_cmd(paths, as_json, out) -> None:
    """CUDA habits in training scripts or folders of them, per file and line, with what to do on Ascend
    (Python's ast only, never run; rules in porting/data/cuda_habits.yaml)."""
    _lint(paths, as_json, out)


def _lint(paths, as_json: bool, out: Path | None) -> None:
    from porting.intake import script_scan

    _check_out(out, paths)
    rep = script_scan.scan(list(paths))
    _write_json(out, rep)
    click.echo(json.dumps(rep, indent=2) if as_json else script_scan.render(rep))


def _check_out(out: Path | None, inputs) -> None:
    """--out under port's one rule (converters.atomic.check_out): a new file, or a scan port wrote; never an input."""
    if out:
        from converters.atomic import check_out, json_of_format
        from porting.diagnostics import DiagnosticsError

        check_out(out, kind="file", inputs=list(inputs), ours=json_of_format("port-script-scan", "port-ops-scan"),
                  what="a scan port wrote", error=DiagnosticsError)


def _write_json(out: Path | None, doc: dict) -> None:
    if out:
        from model_zoo.files import write_atomic

        write_atomic(out, json.dumps(doc, indent=2) + "\n")
