"""`port verify`: numerical parity of the zoo cell with HF transformers, and greedy generation."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click

from model_zoo.errors import CheckpointError, VerificationError

if TYPE_CHECKING:
    from porting.roundtrip import Row


def _table(rows: list[dict]) -> str:
    lines = [f"{'check':34} {'max abs':>11} {'max rel':>11} {'tolerance':>11}  result"]
    for r in rows:
        lines.append(f"{r['name'][:34]:34} {r['max_abs']:11.3e} {r['max_rel']:11.3e} "
                     f"{r['tolerance']:11.1e} ({r['measure'].replace('max_', '')})  {'ok' if r['passed'] else 'FAIL'}")
    return "\n".join(lines)


def run_generation_check(hf_dir, n_tokens: int, cache: str = "static") -> dict:
    """Greedy tokens from BOS on the zoo cell vs HF's own greedy ``generate``; golden text if known."""
    import torch

    from converters.loading import load_hf_dir
    from model_zoo import LlamaConfig, build, presets
    from model_zoo.decode import greedy
    from porting.tokenizer import load_tokenizer
    from porting.parity import load_hf_reference

    cfg = LlamaConfig.from_hf(hf_dir)
    golden = next((p.get("golden") for p in presets.PRESETS
                   if p.get("path") and str(p["path"]) == str(hf_dir)), None)
    prompt = golden["prompt_ids"] if golden else [cfg.bos_token_id if cfg.bos_token_id is not None else 0]
    model = build(cfg)
    load_hf_dir(model, hf_dir)
    ours = greedy(model, prompt, n_tokens, cache=cache)
    ref_model = load_hf_reference(hf_dir, "float32")
    with torch.no_grad():
        ref = ref_model.generate(torch.tensor([prompt]), max_new_tokens=n_tokens, do_sample=False,
                                 min_new_tokens=n_tokens, pad_token_id=0)[0, len(prompt):].tolist()
    first_diff = next((i for i, (a, b) in enumerate(zip(ours, ref)) if a != b), None)
    res = {"prompt_ids": prompt, "new_tokens": n_tokens, "kv_cache": cache, "zoo_ids": ours, "hf_ids": ref,
           "tokens_equal": ours == ref, "first_difference": first_diff}
    try:
        tok = load_tokenizer(hf_dir)
        res["text"] = tok.decode(ours, skip_special_tokens=True)
    except Exception as e:  # a checkpoint without tokenizer files still gets the token comparison
        res["text"] = None
        res["tokenizer_error"] = str(e).splitlines()[0]
    if golden and n_tokens == golden["new_tokens"]:
        res["golden_text"] = golden["text"]
        res["golden_equal"] = res["text"] == golden["text"]
    res["passed"] = res["tokens_equal"] and res.get("golden_equal", True)
    return res


def _echo_rows(hf_dir, ms_dir, rows: list[Row]) -> None:
    click.echo(f"checkpoint {ms_dir} against {hf_dir}:")
    for r in rows:
        click.echo(f"  {r.name:12} {'ok  ' if r.passed else 'FAIL'} {r.detail}")


def _fail_checkpoint(hf_dir, ms_dir, rows: list[Row], as_json: bool) -> None:
    """Report the checkpoint rows, name the failed claims, exit 1 (parity is not run)."""
    failed = [r.name for r in rows if not r.passed]
    if as_json:
        click.echo(json.dumps({"passed": False, "checkpoint": [r.to_dict() for r in rows], "failed": failed,
                               "parity": "not run: the checkpoint failed " + ", ".join(failed)}, indent=1))
    else:
        _echo_rows(hf_dir, ms_dir, rows)
        click.echo(f"FAIL: the checkpoint failed {', '.join(failed)}; parity not run")
    sys.exit(VerificationError.exit_code)


@click.command("verify", epilog="""\b
Examples:
  port verify --hf stories260k                 # embedded default: logits and loss vs HF
  port verify --hf stories260k --generate      # plus greedy text vs HF generate and the golden text
  port verify --hf ./my-llama --hidden-states --grads --json
  port verify --hf llama-7b --seq 16 --batch 1 # zoo name, found in the local HF cache
  port convert --hf stories260k --out st-ms && port verify --hf stories260k --ms st-ms
  port verify --hf ./my-llama --ms ./my-llama-ms --no-roundtrip --rehash-source
\b
Tolerances (max abs on logits / abs on loss / rel on gradient norms):
  float32 1e-4 / 1e-5 / 1e-4;  float16 5e-2 / 5e-3 / 2e-2;  bfloat16 2.5e-1 / 3e-2 / 1e-1""")
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
              type=click.Choice(["static", "dynamic", "none"]),
              help="KV cache for --generate: static (one compiled graph), dynamic (PyNative, grows), none.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON object instead of tables.")
def command(hf_src, ms_dir, no_roundtrip, rehash_source, dtype, batch, seq, seed, hidden_states, grads, gen_tokens, cache_mode, as_json):
    """Check a zoo model against HF transformers on the same weights and inputs."""
    from porting.parity import check_parity
    from porting.model_paths import resolve_hf

    hf_dir = resolve_hf(hf_src)
    rows = None
    if ms_dir is not None:
        from porting.roundtrip import verify_checkpoint

        if not ms_dir.is_dir():
            raise CheckpointError(f"--ms {ms_dir}: no such directory; expected a `port convert` output directory")
        rows = verify_checkpoint(hf_dir, ms_dir, roundtrip=not no_roundtrip, rehash_source=rehash_source)
    ms_ok = rows is None or all(r.passed for r in rows)
    if not ms_ok:
        # A checkpoint that fails a claim is FAIL whatever parity says, and parity on the HF weights
        # would say nothing about it: the rows name the claim that failed.
        _fail_checkpoint(hf_dir, ms_dir, rows, as_json)
    report = check_parity(hf_dir, dtype=dtype, batch=batch, seq=seq, seed=seed, hidden_states=hidden_states,
                          grads=grads, ms_dir=ms_dir if ms_ok else None)
    if rows is not None:
        report["checkpoint"] = [r.to_dict() for r in rows]
        report["passed"] = report["passed"] and ms_ok
    if gen_tokens:
        report["generation"] = run_generation_check(hf_dir, gen_tokens, cache=cache_mode)
        report["passed"] = report["passed"] and report["generation"]["passed"]
    if as_json:
        click.echo(json.dumps(report, indent=1))
    else:
        k = report["kernels"]["kernels"]
        click.echo(f"model {hf_dir} ({report['model_type']}), {dtype}, ids {batch}x{report['seq']} seed {seed}; "
                   f"kernels on {report['kernels']['device']}: "
                   + ", ".join(f"{n}={c['impl']}" for n, c in k.items()))
        click.echo(f"loss on the seeded random probe ids: zoo {report['loss']['zoo']:.6f}  hf {report['loss']['hf']:.6f}")
        if rows is not None:
            _echo_rows(hf_dir, ms_dir, rows)
        click.echo(_table(report["checks"]))
        g = report.get("generation")
        if g:
            click.echo(f"greedy {g['new_tokens']} tokens (KV cache: {g['kv_cache']}): "
                       + ("identical to HF generate" if g["tokens_equal"]
                          else f"DIFFERS from HF generate at token {g['first_difference']}"))
            if g.get("text") is not None:
                click.echo(f"text: {g['text']}")
            if "golden_equal" in g:
                click.echo("golden text: " + ("matches" if g["golden_equal"] else "DOES NOT MATCH"))
        click.echo("PASS" if report["passed"] else "FAIL")
    if not report["passed"]:
        sys.exit(VerificationError.exit_code)
