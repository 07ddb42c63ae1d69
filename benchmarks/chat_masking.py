"""Chat-template masking cost, this tree against another checkout (e.g. the tree before issue 27), side by
side in one run: each tree is measured in its own process with PYTHONPATH pointing at it.

    python benchmarks/chat_masking.py --before /work/main --turns 64,256,1024,4096 --timeout 300

1. Demo data (normal templates, where masking renders most): the 16 real rows of
   tests/train/fixtures/openai_parts_v1_sft_demo.jsonl repeated 32 times (512 rows), tokenised with the
   offline Llama 3 and Qwen2 tokenizers of tests/train/chat_tokenizers.py and their real templates
   (data.chat_template: model); and the TinyStories sample with stories260K (no template, the text cut).
2. One row of N turns (short user/assistant pairs, Llama 3's template), max_seq_length 512.
Best of --repeat wall times per measurement; tokenizer builds are not timed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _best(fn, repeat: int) -> float:
    times = []
    for _ in range(repeat):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def measure(turns: list[int], repeat: int, tmp: Path) -> dict:
    """In the tree on sys.path: seconds per measurement."""
    from porting.tokenizer import load_tokenizer
    from porting.train.data.tokenise import tokenize_dataset
    from porting.train.recipe.schema import validate_recipe
    from tests.train import chat_tokenizers as CT

    fix = ROOT / "tests" / "train" / "fixtures"

    def data(path: Path, **kw):
        return validate_recipe({"model": {"source": "stories260k"}, "data": {"path": str(path), **kw}},
                               check_files=False).data

    out = {}
    if turns:
        tok = CT.build("llama3")
    for n in turns:
        p = tmp / f"turns{n}.jsonl"
        msgs = [{"role": "user" if i % 2 == 0 else "assistant", "content": f"message {i}."} for i in range(n)]
        p.write_text(json.dumps({"messages": msgs}) + "\n")
        d = data(p, chat_template="model", max_seq_length=512)
        out[f"one row of {n} turns, llama3, max_seq_length 512"] = _best(lambda: tokenize_dataset(d, tok), 1)
    if turns:
        return out
    demo = tmp / "demo.jsonl"
    demo.write_text((fix / "openai_parts_v1_sft_demo.jsonl").read_text() * 32)
    for name in ("llama3", "qwen2"):
        tok = CT.build(name)
        d = data(demo, chat_template="model", max_seq_length=512)
        out[f"demo 512 rows, {name} template"] = _best(lambda: tokenize_dataset(d, tok), repeat)
    stories = load_tokenizer(ROOT / "model_zoo" / "assets" / "stories260k")
    d = data(ROOT / "porting" / "train" / "assets" / "tinystories_sample.txt", max_seq_length=256)
    out["TinyStories sample, stories260K (text)"] = _best(lambda: tokenize_dataset(d, stories), repeat)
    return out


def run_tree(tree: Path, turns: list[int], repeat: int, timeout: float) -> dict:
    """One tree's numbers, in a process of its own; a measurement past ``timeout`` is reported as such."""
    res = {}
    for group in [[]] + [[n] for n in turns]:   # the demo first, then each row size alone (each may time out)
        cmd = [sys.executable, __file__, "--child", "--turns", ",".join(map(str, group)), "--repeat", str(repeat)]
        env = dict(os.environ, PYTHONPATH=str(tree))
        try:
            p = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=timeout, cwd=tree)
            got = json.loads(p.stdout.strip().splitlines()[-1])
        except subprocess.TimeoutExpired:
            got = {f"one row of {n} turns, llama3, max_seq_length 512": f"> {timeout:g} s (stopped)" for n in group}
        res.update(got)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--before", type=Path, help="another checkout to measure side by side")
    ap.add_argument("--turns", default="64,256,1024,4096")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--timeout", type=float, default=300)
    ap.add_argument("--child", action="store_true")
    a = ap.parse_args()
    turns = [int(x) for x in a.turns.split(",") if x]
    if a.child:
        with tempfile.TemporaryDirectory() as tmp:
            print(json.dumps(measure(turns, a.repeat, Path(tmp))))
        return
    trees = {"this tree": ROOT, **({"before": a.before} if a.before else {})}
    res = {name: run_tree(t, turns, a.repeat, a.timeout) for name, t in trees.items()}
    print("| measurement | " + " | ".join(res) + " |\n|---|" + "---|" * len(res))
    for k in res["this tree"]:
        cells = [v[k] if isinstance(v.get(k), str) else f"{v[k]:.3f} s" for v in res.values()]
        print(f"| {k} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
