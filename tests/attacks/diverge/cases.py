"""`port diverge`: runs without fingerprints, fingerprint files port did not write, a link where a file was, and
an --out that is someone else's file are one line each, nothing written."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from tests.attacks.harness import case


def _run(d: Path, name: str, lines: list[str] | None = None) -> Path:
    """A run directory whose fingerprints/rank_0.jsonl holds ``lines`` (default: a valid step 1)."""
    from porting.rundir import fingerprints as fp

    run = d / name
    (run / "fingerprints").mkdir(parents=True)
    f = run / "fingerprints" / "rank_0.jsonl"
    if lines is not None:
        f.write_text("\n".join(lines) + "\n")
        return run
    w = fp.Writer(f, {"source": "port", "layout": "zoo", "dtype": "float32"})
    w.record(1, "batch", "input_ids", fp.stat_of(np.arange(8, dtype=np.float32)))
    w.record(1, "update", "lm_head.weight", fp.stat_of(np.ones(4, np.float32)))
    w.close()
    return run


@case("no fingerprints there", "logging.fingerprint_every", dest=None)
def a_run_without_fingerprints(d):
    (d / "run").mkdir()
    return ["diverge", str(d / "run"), str(_run(d, "b"))]


@case("expected the header", dest=None)
def a_file_without_the_header(d):
    return ["diverge", str(_run(d, "a", ['{"step": 1, "phase": "update"}'])), str(_run(d, "b"))]


@case("integer of", dest=None)
def a_count_of_1000_digits(d):
    row = '{"step": 1, "phase": "update", "name": "x", "count": ' + "9" * 1000 + "}"
    return ["diverge", str(_run(d, "a", ['{"fingerprints": 1}', row])), str(_run(d, "b"))]


@case("symbolic link", dest=None)
def a_fingerprint_file_that_is_a_link(d):
    secret = d / "secret.jsonl"
    secret.write_text('{"fingerprints": 1}\n')
    a = _run(d, "a")
    f = a / "fingerprints" / "rank_0.jsonl"
    f.unlink()
    f.symlink_to(secret)
    return ["diverge", str(a), str(_run(d, "b"))]


@case("not a file `port diverge` wrote", dest=None)
def out_is_another_programs_file(d):
    (d / "notes.json").write_text(json.dumps({"mine": True}))
    return ["diverge", str(_run(d, "a")), str(_run(d, "b")), "--out", str(d / "notes.json")]


@case("did not see the same batches", dest=None)
def two_data_orders(d):
    from porting.rundir import fingerprints as fp

    b = _run(d, "b")
    w = fp.Writer(b / "fingerprints" / "rank_0.jsonl", {"source": "port", "layout": "zoo"})
    w.record(1, "batch", "input_ids", fp.stat_of(np.arange(1, 9, dtype=np.float32)))
    w.close()
    return ["diverge", str(_run(d, "a")), str(b)]


@case("formats 1, 2", "digests differ by construction", dest=None)
def a_format_1_run_against_a_format_2_run(d):
    a = _run(d, "a")   # an older port's run: the same records under the format-1 header
    f = a / "fingerprints" / "rank_0.jsonl"
    lines = f.read_text().splitlines()
    head = json.loads(lines[0])
    assert head["fingerprints"] == 2
    f.write_text("\n".join([json.dumps({**head, "fingerprints": 1})] + lines[1:]) + "\n")
    return ["diverge", str(a), str(_run(d, "b"))]


@case("expected a collective record", dest=None)
def a_collective_record_naming_a_path(d):
    """A collective record whose bucket names a path instead of HF names (the field is bounded and checked)."""
    row = {"step": 1, "phase": "collective", "name": "allreduce/bucket_0/output", "first": "../../etc/passwd",
           "last": "lm_head.weight", "tensors": 1, "count": 2, "sum": 0.0, "sumsq": 0.0, "maxabs": 0.0,
           "nonfinite": 0, "digest": "0" * 16}
    return ["diverge", str(_run(d, "a", ['{"fingerprints": 2}', json.dumps(row)])), str(_run(d, "b"))]
