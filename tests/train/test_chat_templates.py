"""Chat templates: the real templates of Llama 3 Instruct, Qwen2 Instruct and Mistral Instruct render the
conversations, and only assistant turns (with the token that closes them) are in the loss, exactly,
token by token, including system prompts and several turns."""

from __future__ import annotations

import json

import pytest

from model_zoo.errors import RecipeError
from model_zoo.labels import IGNORE_INDEX
from porting.train.data.tokenise import tokenize_dataset
from porting.train.data.chat import TemplateRenderer
from porting.train.data.formats import Conversation, Turn
from porting.train.recipe.schema import validate_recipe
from tests.train import chat_tokenizers as CT
from tests.train.conftest import ROOT, error_line
from tests.helpers import port

FIX = ROOT / "tests" / "train" / "fixtures"
SYSTEM, Q1, A1, Q2, A2 = "Be brief.", "Hello", "Hi there", "Who are you", "   I am an assistant   "
# What each template renders after an assistant reply (its own end-of-turn), from the template text.
CLOSE = {"llama3": "<|eot_id|>", "qwen2": "<|im_end|>\n", "mistral": "</s> "}


@pytest.fixture(scope="module", params=["llama3", "qwen2", "mistral"])
def named(request):
    return request.param, CT.build(request.param)


def _conv(name: str) -> Conversation:
    turns = [Turn("user", Q1, False), Turn("assistant", A1, True), Turn("user", Q2, False), Turn("assistant", A2, True)]
    return Conversation(tuple(turns if name == "mistral" else [Turn("system", SYSTEM, False)] + turns))


def _runs(ids, labels) -> list[list[int]]:
    """Contiguous runs of trained tokens."""
    runs, cur = [], []
    for t, l in zip(ids, labels):
        if l != IGNORE_INDEX:
            cur.append(t)
        elif cur:
            runs, cur = runs + [cur], []
    return runs + ([cur] if cur else [])


def test_rendered_string_is_the_models_own(named):
    name, tok = named
    text, spans = TemplateRenderer(tok, tok.chat_template, name).spans(_conv(name))
    assert text == tok.apply_chat_template(_conv(name).messages(), tokenize=False)
    if name == "llama3":   # the template trims content; the header is never learned
        assert text.startswith("<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>")
        assert [text[a:b] for a, b in spans] == ["Hi there<|eot_id|>", "I am an assistant<|eot_id|>"]
    elif name == "qwen2":
        assert text.startswith("<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\nHello<|im_end|>\n")
        assert [text[a:b] for a, b in spans] == ["Hi there<|im_end|>\n", "   I am an assistant   <|im_end|>\n"]
    else:
        assert text == "<s>[INST] Hello [/INST]Hi there</s> [INST] Who are you [/INST]   I am an assistant   </s> "
        assert [text[a:b] for a, b in spans] == ["Hi there</s> ", "   I am an assistant   </s> "]


def test_mask_is_exact_at_token_level(named):
    name, tok = named
    r = TemplateRenderer(tok, tok.chat_template, name)
    text, spans = r.spans(_conv(name))
    ids, labels = r.encode(_conv(name))
    assert ids == tok(text, add_special_tokens=False)["input_ids"], "one tokenisation of the whole rendered string"
    runs = _runs(ids, labels)
    assert len(runs) == 2
    for k, (run, reply) in enumerate(zip(runs, (A1, A2))):
        got = tok.decode(run, skip_special_tokens=False)
        want = (reply.strip() if name == "llama3" else reply) + CLOSE[name]
        # Whitespace at a turn's edge that the tokenizer merges with its neighbour is left out, never
        # anything else: Mistral's space after </s> goes into the next "▁[INST]", and Qwen2's
        # byte-level BPE joins "\n  " of the header with the reply's leading spaces.
        assert got in want and got.strip() == want.strip(), (got, want)
        if k == 0:
            assert got == want.rstrip(" "), (got, want)
    # every token outside the runs is a prompt, header or system token
    untrained = tok.decode([t for t, l in zip(ids, labels) if l == IGNORE_INDEX], skip_special_tokens=False)
    assert Q1 in untrained and Q2 in untrained and A1 not in untrained and "I am an assistant" not in untrained


def test_real_samples_through_each_template(named, tmp_path):
    name, tok = named
    tok.name_or_path = name
    rows = [json.loads(l) for l in (FIX / "openai_parts_v1_sft_demo.jsonl").read_text().splitlines()]
    raw = {"model": {"source": "stories260k"}, "data": {"path": str(FIX / "openai_parts_v1_sft_demo.jsonl"),
                                                        "max_seq_length": 512}}
    td = tokenize_dataset(validate_recipe(raw).data, tok)     # auto: the tokenizer has a template, so model
    assert td.report.rows == 16 and td.report.bad_rows == 0 and td.report.examples == 16
    for e, row in zip(td.examples, rows):
        reply = row["messages"][1]["content"][0]["value"]
        (run,) = _runs(e.input_ids.tolist(), e.labels.tolist())
        got = tok.decode(run, skip_special_tokens=False)
        want = (reply.strip() if name == "llama3" else reply) + CLOSE[name]
        assert got in want and got.strip() == want.strip(), (got, want)
        if tok.bos_token_id is not None:   # the template's BOS, not a second one
            assert e.input_ids[0] == tok.bos_token_id and e.input_ids[1] != tok.bos_token_id


def test_mistral_refuses_a_system_prompt_row_by_row(tmp_path):
    tok = CT.build("mistral")
    rows = [{"messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": Q1},
                          {"role": "assistant", "content": A1}]},
            {"messages": [{"role": "user", "content": Q1}, {"role": "assistant", "content": A1}]}]
    p = tmp_path / "m.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    raw = {"model": {"source": "stories260k"}, "data": {"path": str(p), "chat_template": "model"}}
    td = tokenize_dataset(validate_recipe(raw).data, tok)
    assert td.report.bad_rows == 1 and td.report.examples == 1
    assert "row 1: the chat template refused the row: Conversation roles must alternate" in td.report.bad_row_samples[0]


# A reduced DeepSeek-R1 style template: earlier assistant turns lose their reasoning once a later turn
# follows, so the beginning of a conversation is not rendered as a prefix of the whole.
DROPS_REASONING = ("{% for m in messages %}{% if m['role'] == 'assistant' %}{% set c = m['content'] %}"
                   "{% if not loop.last %}{% set c = c.split('</think>')[-1] %}{% endif %}"
                   "{{ '<|Assistant|>' + c + '<|end|>' }}{% else %}{{ '<|User|>' + m['content'] }}{% endif %}"
                   "{% endfor %}{% if add_generation_prompt %}{{ '<|Assistant|>' }}{% endif %}")
# A template that numbers each turn by how many follow it: no turn renders the same once more follow.
COUNTS_DOWN = ("{% for m in messages %}{% if messages|length > 4 %}{{ (messages|length - loop.index0)|string }}"
               "{% endif %}{{ '<' + m['role'] + '>' + m['content'] + '</s>' }}{% endfor %}"
               "{% if add_generation_prompt %}{{ '<assistant>' }}{% endif %}")
# A template whose generation prompt is not how it opens an assistant turn.
WRONG_PROMPT = ("{% for m in messages %}{{ '<' + m['role'] + '>' + m['content'] + '</s>' }}{% endfor %}"
                "{% if add_generation_prompt %}{{ '<bot>' }}{% endif %}")


def test_templates_that_cannot_be_masked_are_refused(tmp_path):
    tok = CT.build("qwen2")
    with pytest.raises(RecipeError, match=r"data.chat_template \(bad\): the template cannot be masked exactly"):
        TemplateRenderer(tok, WRONG_PROMPT, "bad")
    conv = Conversation((Turn("user", Q1, False), Turn("assistant", "<think>hm</think>" + A1, True),
                         Turn("user", Q2, False), Turn("assistant", A2, True)))
    # reasoning dropped from history is masked as the whole conversation renders the turn (Qwen3 does this too)
    text, spans = TemplateRenderer(tok, DROPS_REASONING, "r1").spans(conv)
    assert [text[a:b] for a, b in spans] == [A1 + "<|end|>", A2 + "<|end|>"]
    # a template that rewrites the earlier turns themselves cannot be masked
    r = TemplateRenderer(tok, COUNTS_DOWN, "countdown")   # the probe's turns are fine ...
    with pytest.raises(RecipeError, match="not a prefix of the whole conversation"):
        r.spans(Conversation(conv.turns + (Turn("user", "more", False), Turn("assistant", "ok", True))))
    # through port train: one error line, the template named, nothing trained
    f = tmp_path / "bad.jinja"
    f.write_text(WRONG_PROMPT)
    res = port("train", "recipes/tiny-cpu.yaml", "--set", f"data.path={FIX / 'openai_parts_v1_sft_demo.jsonl'}",
               "--set", "data.format=chat", "--set", "data.long_text=truncate", "--set", f"data.chat_template={f}",
               "--run-dir", str(tmp_path / "run"))
    line = error_line(res)
    assert res.returncode == 2 and "cannot be masked exactly" in line and str(f) in line
    assert not (tmp_path / "run" / "checkpoints").exists()


def test_template_choice_errors():
    from porting.tokenizer import load_tokenizer

    stories = load_tokenizer(ROOT / "model_zoo" / "assets" / "stories260k")
    raw = {"model": {"source": "stories260k"}, "data": {"path": str(FIX / "openai_parts_v1_sft_demo.jsonl")}}
    with pytest.raises(RecipeError, match="data.chat_template: model, but the tokenizer of .* has no chat_template"):
        tokenize_dataset(validate_recipe({**raw, "data": {**raw["data"], "chat_template": "model"}}).data, stories)
    with pytest.raises(RecipeError, match="chat template .* not found"):
        tokenize_dataset(validate_recipe({**raw, "data": {**raw["data"], "chat_template": "/no/such.jinja"}}).data,
                           stories)
    # builtin stays the named fallback even when the tokenizer has a template
    llama = CT.build("llama3")
    td = tokenize_dataset(validate_recipe({**raw, "data": {**raw["data"], "chat_template": "builtin"}}).data, llama)
    assert "<|user|>" in llama.decode(td.examples[0].input_ids.tolist())


# ------------------------------------------------------------------ Qwen3: thinking blocks, enable_thinking
REASON = "<think>\nFirst, greet.\n</think>\n\n"


@pytest.fixture(scope="module")
def qwen3():
    return CT.build("qwen3")


def _qwen3_conv(reason_first: bool = False, reason_last: bool = False) -> Conversation:
    return Conversation((Turn("system", SYSTEM, False), Turn("user", Q1, False),
                         Turn("assistant", (REASON if reason_first else "") + A1, True), Turn("user", Q2, False),
                         Turn("assistant", (REASON if reason_last else "") + A2, True)))


@pytest.mark.parametrize("reason_first,reason_last,enable_thinking,want", [
    # the last turn always gets a thinking block (empty without reasoning); earlier turns lose theirs
    (False, False, None, ["Hi there<|im_end|>\n", "<think>\n\n</think>\n\n   I am an assistant   <|im_end|>\n"]),
    (True, True, None, ["Hi there<|im_end|>\n",
                        "<think>\nFirst, greet.\n</think>\n\n   I am an assistant   <|im_end|>\n"]),
    # enable_thinking false: the generation prompt holds the empty thinking block, so it is prompt, not loss
    (False, False, False, ["Hi there<|im_end|>\n", "   I am an assistant   <|im_end|>\n"]),
    (False, False, True, ["Hi there<|im_end|>\n", "<think>\n\n</think>\n\n   I am an assistant   <|im_end|>\n"]),
])
def test_qwen3_masks_what_its_template_renders(qwen3, reason_first, reason_last, enable_thinking, want):
    conv = _qwen3_conv(reason_first, reason_last)
    r = TemplateRenderer(qwen3, qwen3.chat_template, "qwen3", enable_thinking)
    text, spans = r.spans(conv)
    kwargs = {} if enable_thinking is None else {"enable_thinking": enable_thinking}
    assert text == qwen3.apply_chat_template(conv.messages(), tokenize=False, **kwargs)   # HF's own rendering
    assert [text[a:b] for a, b in spans] == want
    # the generation prompt HF renders for the last reply is exactly the text before its learned range
    prompt = qwen3.apply_chat_template(conv.messages()[:-1], tokenize=False, add_generation_prompt=True, **kwargs)
    assert text[:spans[-1][0]] == prompt
    ids, labels = r.encode(conv)
    assert ids == qwen3(text, add_special_tokens=False)["input_ids"]
    runs = [qwen3.decode(run, skip_special_tokens=False) for run in _runs(ids, labels)]
    assert len(runs) == 2
    for got, w in zip(runs, want):   # only edge whitespace merged into a prompt token may be left out
        assert got in w and got.strip() == w.strip(), (got, w)
    r.close()


def test_qwen3_template_is_the_released_one(qwen3):
    """The fixture is the hybrid-thinking template: one user/assistant pair renders as the Qwen3 release
    documents it (an empty thinking block before the reply), and enable_thinking false prompts with it."""
    msgs = [{"role": "user", "content": "Hi"}, {"role": "assistant", "content": "Hello"}]
    assert qwen3.apply_chat_template(msgs, tokenize=False) == \
        "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n\nHello<|im_end|>\n"
    assert qwen3.apply_chat_template(msgs[:1], tokenize=False, add_generation_prompt=True, enable_thinking=False) \
        .endswith("<|im_start|>assistant\n<think>\n\n</think>\n\n")


def test_enable_thinking_reaches_the_template_from_the_recipe(qwen3, tmp_path):
    rows = [{"messages": [{"role": "user", "content": Q1}, {"role": "assistant", "content": A1}]}]
    p = tmp_path / "q.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    got = {}
    for flag in (None, False):
        raw = {"model": {"source": "stories260k"},
               "data": {"path": str(p), "chat_template": "model", "enable_thinking": flag, "shuffle": False}}
        e = tokenize_dataset(validate_recipe(raw).data, qwen3).examples[0]
        got[flag] = qwen3.decode([t for t, l in zip(e.input_ids.tolist(), e.labels.tolist()) if l != IGNORE_INDEX],
                                 skip_special_tokens=False)
    assert got[None] == "<think>\n\n</think>\n\nHi there<|im_end|>\n" and got[False] == "Hi there<|im_end|>\n"
