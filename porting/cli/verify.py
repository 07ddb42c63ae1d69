"""`port verify`: numerical parity of the zoo cell with HF transformers, and greedy generation (the library:
:func:`porting.verify.model.verify_model`)."""

from __future__ import annotations

import json
from pathlib import Path

import click

from model_zoo.errors import VerificationError
from porting.verify.generation import CACHE_MODES


@click.command("verify", epilog="""\b
Examples:
  port verify --hf stories260k                 # embedded default: logits and loss vs HF
  port verify --hf stories260k --generate      # plus greedy text vs HF generate and the golden text
  port verify --hf ./my-llama --hidden-states --grads --json
  port verify --hf llama-7b --seq 16 --batch 1 # zoo name, found in the local HF cache
  port convert --hf stories260k --out st-ms && port verify --hf stories260k --ms st-ms
  port verify --hf ./my-llama --ms ./my-llama-ms --no-roundtrip --rehash-source
\b
Tolerances (porting/verify/stats.py TOLERANCES; max abs on logits / abs on loss / rel on gradient norms):
  float32 1e-4 / 1e-5 / 1e-4;  float16 5e-2 / 5e-3 / 2e-2;  bfloat16 2.5e-1 / 3e-2 / 1e-1
Each check is one row: name, measure, value, tolerance, result, detail (--json: the same keys).""")
@click.option("--hf", "hf_src", required=True, help="HF model directory, or a zoo name (see `port zoo list`).")
@click.option("--ms", "ms_dir", type=click.Path(path_type=Path), default=None,
              help="A `port convert` output: check it tensor by tensor against --hf, round-trip it back to HF, "
                   "and run the parity check with the zoo cell loaded from it.")
@click.option("--no-roundtrip", is_flag=True, help="With --ms: skip the HF -> MS -> HF round trip.")
@click.option("--rehash-source", is_flag=True,
              help="With --ms: recompute every source sha256 in the manifest (those taken from the HF cache "
                   "are always recomputed).")
@click.option("--dtype", default="float32", show_default=True,
              type=click.Choice(["float32", "float16", "bfloat16"]), help="Compute dtype on both sides.")
@click.option("--batch", default=2, show_default=True, type=click.IntRange(1, 64))
@click.option("--seq", default=32, show_default=True, type=click.IntRange(2, 8192))
@click.option("--seed", default=0, show_default=True, type=int, help="Seed of the fixed probe token ids.")
@click.option("--hidden-states", is_flag=True, help="Also compare every layer's hidden state.")
@click.option("--grads", is_flag=True, help="Also compare every parameter's gradient norm.")
@click.option("--generate", "gen_tokens", is_flag=False, flag_value=60, default=None, type=int,
              help="Also greedy-generate N tokens (default 60) and compare with HF generate.")
@click.option("--cache", "cache_mode", default="static", show_default=True,
              type=click.Choice(CACHE_MODES),
              help="KV cache for --generate: static (one compiled graph), dynamic (PyNative, grows), none.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def command(hf_src, ms_dir, no_roundtrip, rehash_source, dtype, batch, seq, seed, hidden_states, grads, gen_tokens, cache_mode, as_json):
    """Check a zoo model against HF transformers on the same weights and inputs."""
    from porting.model_paths import resolve_hf
    from porting.verify.model import render, verify_model

    report = verify_model(resolve_hf(hf_src), ms_dir, roundtrip=not no_roundtrip, rehash_source=rehash_source,
                          dtype=dtype, batch=batch, seq=seq, seed=seed, hidden_states=hidden_states, grads=grads,
                          generate=gen_tokens, cache=cache_mode)
    click.echo(json.dumps(report, indent=1) if as_json else render(report))
    if not report["passed"]:
        raise SystemExit(VerificationError.exit_code)
