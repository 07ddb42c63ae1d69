"""Chat templates bounded and read as transformers reads them: the worker process's limits,
named-template lists, templates that cannot be masked or do not compile, masking whose work does not
grow with the number of turns beyond the kept window, relative template paths, and long rows cut
before they are tokenised. The hostile cases through the CLI are tests/attacks/templates."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from model_zoo.errors import RecipeError
from porting.tokenizer import load_tokenizer
from porting.train.data.chat import TemplateRenderer
from porting.train.data.cut import char_bound
from porting.train.data.formats import Conversation, Turn
from porting.train.data.template_process import TemplateProcess, WorkerFailure
from porting.train.data.tokenise import tokenize_dataset
from porting.train.recipe.schema import load_recipe, validate_recipe
from tests.train import chat_tokenizers as CT
from tests.train.conftest import ROOT, STORIES

FIX = ROOT / "tests" / "train" / "fixtures"
QWEN_LIKE = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
             "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


@pytest.fixture(scope="module")
def qwen():
    return CT.build("qwen2")


@pytest.fixture(scope="module")
def qwen_dir(qwen, tmp_path_factory):
    d = tmp_path_factory.mktemp("qwen")
    qwen.save_pretrained(d)
    return d


def _turns(n: int) -> Conversation:
    turns = []
    for i in range(n // 2):
        turns += [Turn("user", f"Question {i}?", False), Turn("assistant", f"Answer {i}.", True)]
    return Conversation(tuple(turns))


def _data(path: Path, **kw):
    return validate_recipe({"model": {"source": "stories260k"}, "data": {"path": str(path), **kw}},
                           check_files=False).data


def test_worker_stops_bombs_and_is_gone_afterwards():
    loop = "{% for i in 'x' * 99999 %}{% for j in 'x' * 99999 %}{% endfor %}{% endfor %}"
    p = TemplateProcess(loop, {}, deadline_s=1.0)
    with pytest.raises(WorkerFailure, match="longer than 1 s") as e:
        p.ask({"op": "row", "messages": [{"role": "user", "content": "hi"}], "train": [], "limit": 1})
    assert e.value.kind == "limit" and p.proc.poll() is not None, "the worker is killed at its deadline"
    for src, why in [("{{ 'x' * 10**10 }}", "repeated"), ("{{ 9 ** (9 ** 9) }}", "bits"),
                     ("{{ lipsum(n=10**6) }}", "lipsum"), ("{{ messages|tojson(indent=10**8) }}", "tojson indent"),
                     ("{% macro f() %}{{ f() }}{% endmacro %}{{ f() }}", "recurses")]:
        p = TemplateProcess(src, {})
        with pytest.raises(WorkerFailure, match=why):
            p.ask({"op": "row", "messages": [{"role": "user", "content": "hi"}], "train": [], "limit": 1})
        p.close()
        assert p.proc.poll() is not None


def test_syntax_error_is_a_syntax_error_with_file_and_line(qwen, tmp_path):
    t = tmp_path / "t.jinja"
    t.write_text("{# a comment #}\n{% for m in messages %}{{ m['content'] }\n{% endfor %}")
    with pytest.raises(RecipeError, match=rf"data.chat_template \({t}\): Jinja syntax error at line 2: ") as e:
        tokenize_dataset(_data(FIX / "openai_parts_v1_sft_demo.jsonl", chat_template=str(t)), qwen)
    assert "cannot be masked" not in str(e.value)


def test_template_without_generation_prompt_is_refused(qwen):
    no_prompt = QWEN_LIKE[:QWEN_LIKE.index("{% if add_generation_prompt")]
    with pytest.raises(RecipeError, match="no add_generation_prompt branch"):
        TemplateRenderer(qwen, no_prompt, "t.jinja")
    TemplateRenderer(qwen, QWEN_LIKE, "t.jinja").close()   # the same template with the branch is fine


def test_named_template_list_is_read_as_transformers_reads_it(qwen, qwen_dir, tmp_path):
    """tokenizer_config.json's ``chat_template: [{name, template}, ...]`` (transformers
    ``PreTrainedTokenizerBase.__init__`` makes it a dict; ``get_chat_template`` takes ``default``)."""
    d = tmp_path / "tok"
    d.mkdir()
    for f in qwen_dir.iterdir():
        (d / f.name).write_bytes(f.read_bytes())
    (d / "chat_template.jinja").unlink(missing_ok=True)   # transformers would prefer it to the config's list
    cfg = json.loads((d / "tokenizer_config.json").read_text())
    tool = "Tools: none.\n" + QWEN_LIKE
    cfg["chat_template"] = [{"name": "default", "template": QWEN_LIKE}, {"name": "tool_use", "template": tool}]
    (d / "tokenizer_config.json").write_text(json.dumps(cfg))
    tok = load_tokenizer(d)
    assert isinstance(tok.chat_template, dict)
    path = FIX / "openai_parts_v1_sft_demo.jsonl"
    first = json.loads(path.read_text().splitlines()[0])
    hf = tok.apply_chat_template([{"role": m["role"], "content": m["content"][0]["value"]} for m in first["messages"]],
                                 tokenize=False)
    for choice in ("auto", "model"):
        td = tokenize_dataset(_data(path, chat_template=choice), tok)
        assert tok.decode(td.examples[0].input_ids.tolist()) == hf   # the default template, as HF renders it
    td = tokenize_dataset(_data(path, chat_template="model:tool_use"), tok)
    assert tok.decode(td.examples[0].input_ids.tolist()) == "Tools: none.\n" + hf


def test_masking_work_does_not_grow_with_turns(qwen):
    """A row of 4,096 turns costs one full render plus the prefix renders of the turns inside the kept
    ``max_seq_length`` tokens: the same number of renders as a row of 64 turns, and the same labels."""
    counts, out = {}, {}
    for n in (64, 4096):
        r = TemplateRenderer(qwen, QWEN_LIKE, "t")   # a fresh one each: the same guess of the window's end
        r.renders = 0
        out[n] = r.encode(_turns(n), 256)
        counts[n] = r.renders
        r.close()
    assert counts[64] == counts[4096] < 64, counts
    assert out[64] == out[4096] and len(out[64][0]) == 257


def test_windowed_mask_equals_the_whole_rows_mask(qwen):
    r = TemplateRenderer(qwen, QWEN_LIKE, "t")
    ids, labels = r.encode(_turns(80), None)          # every turn prefix-rendered, the whole text tokenised
    wids, wlabels = r.encode(_turns(80), 200)
    r.close()
    assert len(ids) > 201 and wids == ids[:201] and wlabels == labels[:201]


def test_relative_chat_template_is_found_from_the_recipe_folder(tmp_path, monkeypatch):
    folder = tmp_path / "recipes"
    folder.mkdir()
    (folder / "my.jinja").write_text(QWEN_LIKE)
    (folder / "data.jsonl").write_text((FIX / "openai_parts_v1_sft_demo.jsonl").read_text())
    r = folder / "r.yaml"
    r.write_text(yaml.safe_dump({"model": {"source": str(STORIES)},
                                 "data": {"path": "data.jsonl", "chat_template": "my.jinja"}}))
    monkeypatch.chdir(tmp_path)                        # not the recipe's folder
    assert load_recipe(r).data.chat_template == str(folder / "my.jinja")


def test_long_rows_are_cut_before_tokenising(tmp_path):
    """A row of ~2 MB keeps its first max_seq_length tokens exactly as the whole row's tokenisation
    would, and the tokenizer sees at most char_bound() characters of it."""
    tok = load_tokenizer(STORIES)
    text = "Once upon a time, a small dog found a red ball in the park. " * 35000
    p = tmp_path / "long.jsonl"
    p.write_text(json.dumps({"text": text}) + "\n")

    seen = []

    class Counting:   # the real tokenizer, with the length of every text it is given recorded
        def __getattr__(self, name):
            return getattr(tok, name)

        def encode(self, s, **kw):
            seen.append(len(s))
            return tok.encode(s, **kw)

    td = tokenize_dataset(_data(p, max_seq_length=128), Counting())
    whole = [tok.bos_token_id] + tok.encode(text, add_special_tokens=False)
    assert td.examples[0].input_ids.tolist() == whole[:128] and td.report.truncated == 1
    longest = max(len(t) for t in tok.get_vocab())
    assert max(seen) <= char_bound(128, longest) < len(text) // 100


def test_worker_dies_with_a_killed_port(tmp_path):
    """kill -9 of the process that started the worker (``port``) ends the worker too, even while it is busy
    in a loop and does not read its stdin (PR_SET_PDEATHSIG)."""
    import os
    import signal
    import subprocess
    import sys
    import time

    loop = "{% for a in 'x' * 99999 %}{% for b in 'x' * 99999 %}{% endfor %}{% endfor %}"
    code = ("import json, time\nfrom porting.train.data.template_process import TemplateProcess\n"
            f"p = TemplateProcess({loop!r}, {{}})\n"
            "p.proc.stdin.write(json.dumps({'op': 'row', 'messages': [{'role': 'user', 'content': 'hi'}], 'train': [], 'limit': 1}).encode() + b'\\n')\n"
            "p.proc.stdin.flush()\nprint(p.proc.pid, flush=True)\ntime.sleep(60)\n")
    parent = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True,
                              env=dict(os.environ, PYTHONPATH=str(ROOT)))
    worker = int(parent.stdout.readline())
    os.kill(worker, 0)                                   # running
    parent.kill()
    parent.wait()
    for _ in range(100):
        try:
            os.kill(worker, 0)
        except ProcessLookupError:
            break
        with open(f"/proc/{worker}/stat") as f:          # a zombie until its (re)parent reaps it: gone too
            if f.read().rsplit(")", 1)[1].split()[0] == "Z":
                break
        time.sleep(0.05)
    else:
        os.kill(worker, signal.SIGKILL)
        raise AssertionError("the template worker outlived the killed parent")
