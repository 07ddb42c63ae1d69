"""`port verify`: every check of a model against HF transformers, in one report of :class:`Check` rows.

With ``ms_dir`` (a `port convert` output) the conversion's claims come first (config, coverage, manifest,
every tensor, the round trip; :mod:`porting.verify.roundtrip`); a checkpoint that fails one is FAIL
whatever parity says, and parity is not run (on the HF weights it would say nothing about the checkpoint).
Then parity on the same ids (:mod:`porting.verify.parity`), then, if asked, greedy generation against HF
``generate`` and the golden text (:mod:`porting.verify.generation`). ``checks`` holds every row in that
order; ``passed`` is their verdict.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from model_zoo.errors import CheckpointError
from porting.verify.check import Check, table


def verify_model(hf_dir: Path, ms_dir: Path | None = None, *, roundtrip: bool = True, rehash_source: bool = False,
                 dtype: str = "float32", batch: int = 2, seq: int = 32, seed: int = 0, hidden_states: bool = False,
                 grads: bool = False, generate: int | None = None, cache: str = "static") -> dict[str, Any]:
    """The `port verify` report (a JSON-ready dict; ``checks`` the rows, ``passed`` the verdict)."""
    from porting.verify.parity import check_parity

    rows: list[Check] = []
    if ms_dir is not None:
        from porting.verify.roundtrip import verify_checkpoint

        if not Path(ms_dir).is_dir():
            raise CheckpointError(f"--ms {ms_dir}: no such directory; expected a `port convert` output directory")
        rows = verify_checkpoint(hf_dir, ms_dir, roundtrip=roundtrip, rehash_source=rehash_source)
        failed = [r.name for r in rows if not r.passed]
        if failed:
            return {"hf_dir": str(hf_dir), "zoo_weights_from": str(ms_dir), "passed": False,
                    "checks": [r.to_dict() for r in rows], "failed": failed,
                    "parity": "not run: the checkpoint failed " + ", ".join(failed)}
    report = check_parity(hf_dir, dtype=dtype, batch=batch, seq=seq, seed=seed, hidden_states=hidden_states,
                          grads=grads, ms_dir=ms_dir)
    report["checks"] = [r.to_dict() for r in rows] + report["checks"]
    if generate:
        from porting.verify.generation import check_generation

        gen = check_generation(hf_dir, generate, cache=cache)
        report["checks"] += gen.pop("checks")
        report["generation"] = gen
    report["passed"] = all(c["passed"] for c in report["checks"])
    return report


def render(report: dict[str, Any]) -> str:
    """The text `port verify` prints: what ran, the rows, the generated text, PASS or FAIL."""
    rows = [Check.from_dict(c) for c in report["checks"]]
    if "parity" in report and isinstance(report["parity"], str):   # the checkpoint failed: parity not run
        return "\n".join([f"checkpoint {report['zoo_weights_from']} against {report['hf_dir']}:", table(rows),
                          f"FAIL: the checkpoint failed {', '.join(report['failed'])}; parity not run"])
    k = report["kernels"]
    out = [f"model {report['hf_dir']} ({report['model_type']}), {report['dtype']}, ids {report['batch']}x"
           f"{report['seq']} seed {report['seed']}; kernels on {k['device']}: "
           + ", ".join(f"{n}={c['impl']}" for n, c in k["kernels"].items()),
           f"loss on the seeded random probe ids: zoo {report['loss']['zoo']:.6f}  hf {report['loss']['hf']:.6f}",
           table(rows)]
    g = report.get("generation")
    if g and g.get("text") is not None:
        out.append(f"text: {g['text']}")
    out.append("PASS" if report["passed"] else "FAIL")
    return "\n".join(out)
