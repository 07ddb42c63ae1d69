"""Fine-tuning data as users bring it: ShareGPT, OpenAI messages with content parts, Alpaca with system
and history, per-message loss flags, HF datasets directories and Parquet files, each read from a real
public sample (tests/train/fixtures/README.md) and trained on the real stories260K."""

from __future__ import annotations

import json

import numpy as np
import pytest

from model_zoo.errors import RecipeError
from porting.train.data import formats
from porting.train.data.batching import build_plan
from model_zoo.labels import IGNORE_INDEX
from porting.train.data.tokenise import row_content, tokenize_dataset
from porting.train.recipe.schema import validate_recipe
from porting.tokenizer import load_tokenizer
from tests.train.conftest import ROOT, error_line, metrics
from tests.helpers import port

FIX = ROOT / "tests" / "train" / "fixtures"
EMBEDDED = ROOT / "model_zoo" / "assets" / "stories260k"
SHAREGPT = FIX / "sharegpt_glaive_toolcall_en_demo.json"
PARTS = FIX / "openai_parts_v1_sft_demo.jsonl"
REASON = FIX / "openai_parts_reason_tool_use_demo.jsonl"
ALPACA_H = FIX / "alpaca_system_history.json"


@pytest.fixture(scope="module")
def tok():
    return load_tokenizer(EMBEDDED)


def _recipe(path, **data):
    return validate_recipe({"model": {"source": "stories260k"},
                            "data": {"path": str(path), "max_seq_length": 512, **data}})


def _kept(e) -> list[int]:
    return [int(t) for t, l in zip(e.input_ids, e.labels) if l != IGNORE_INDEX]


def _enc(tok, text: str) -> list[int]:
    return list(tok.encode(text, add_special_tokens=False))


def _write_jsonl(path, rows):
    path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in rows))
    return path


def test_sharegpt_roles_mapped_and_only_replies_learned(tok):
    td = tokenize_dataset(_recipe(SHAREGPT).data, tok)
    rep = td.report
    assert rep.format == "sharegpt" and rep.rows == 6 and rep.bad_rows == 0 and rep.examples == 6
    rows = json.loads(SHAREGPT.read_text())
    # The shortest row with a function call: human, function_call, observation, gpt, ...
    n, row = min(((i, r) for i, r in enumerate(rows) if any(m["from"] == "function_call" for m in r["conversations"])),
                 key=lambda x: len(json.dumps(x[1]["conversations"])))
    e = next(x for x in td.examples if x.source == n + 1)
    want = []
    for m in row["conversations"]:   # gpt and function_call are the assistant's; human and observation are not
        if m["from"] in ("gpt", "function_call"):
            want += _enc(tok, m["value"] + "\n")
    kept = _kept(e)
    # the row is truncated at 512 tokens, so what is learned is the first part of the replies, in order
    assert e.length == 512 and rep.truncated >= 1
    assert kept == (want + [tok.eos_token_id])[:len(kept)] and len(kept) > 100


def test_sharegpt_keys_and_roles_are_configurable(tok, tmp_path):
    rows = [json.loads(l) for l in PARTS.read_text().splitlines()[:4]]
    renamed = [{"dialog": [{"speaker": {"user": "customer", "assistant": "bot"}[m["role"]],
                            "text": m["content"][0]["value"]} for m in r["messages"]]} for r in rows]
    p = _write_jsonl(tmp_path / "renamed.jsonl", renamed)
    sg = {"messages_key": "dialog", "role_key": "speaker", "content_key": "text",
          "roles": {"customer": "user", "bot": "assistant"}}
    td = tokenize_dataset(_recipe(p, sharegpt=sg).data, tok)
    assert td.report.format == "sharegpt" and td.report.examples == 4 and td.report.bad_rows == 0
    assert _kept(td.examples[0]) == _enc(tok, rows[0]["messages"][1]["content"][0]["value"] + "\n") + [tok.eos_token_id]
    with pytest.raises(RecipeError, match=r"no usable example \(4 malformed of 4 rows.*'customer' is not one of"):
        tokenize_dataset(_recipe(p, sharegpt={**sg, "roles": {}}).data, tok)


def test_openai_content_parts_and_loss_weight(tok):
    td = tokenize_dataset(_recipe(PARTS).data, tok)
    assert td.report.format == "chat" and td.report.rows == 16 and td.report.bad_rows == 0
    first = json.loads(PARTS.read_text().splitlines()[0])
    user, reply = (m["content"][0]["value"] for m in first["messages"])
    assert first["messages"][0]["loss_weight"] == 0.0 and first["messages"][1]["loss_weight"] == 1.0
    e = td.examples[0]
    assert _kept(e) == _enc(tok, reply + "\n") + [tok.eos_token_id]
    assert tok.decode(_kept(e), skip_special_tokens=True).strip() == reply
    # loss_weight 1 on the user turn (LLaMA-Factory's way to learn a prompt) takes it into the loss
    flipped = {"messages": [dict(first["messages"][0], loss_weight=1.0), first["messages"][1]]}
    segs = formats.builtin_segments(row_content(flipped, "chat", None, False))
    assert [counts for _, counts in segs] == [False, True, False, True]
    assert user in segs[1][0]


def test_reasoning_tool_parts_and_train_false(tok, tmp_path):
    td = tokenize_dataset(_recipe(REASON).data, tok)
    assert td.report.rows == 4 and td.report.bad_rows == 0
    row = json.loads(REASON.read_text().splitlines()[0])
    conv = row_content(row, "chat", None, False)
    roles = [t.role for t in conv.turns]
    assert roles == ["system", "user", "assistant"] and [t.train for t in conv.turns] == [False, False, True]
    assert conv.turns[2].content.startswith("<think>\n" + row["messages"][2]["content"][0]["value"])
    # train: false keeps an assistant turn out of the loss; the other one stays in
    two = json.loads(REASON.read_text().splitlines()[1])
    msgs = two["messages"]
    asst = [i for i, m in enumerate(msgs) if m["role"] == "assistant"]
    msgs[asst[0]] = dict(msgs[asst[0]], train=False)
    conv = row_content({"messages": msgs}, "chat", None, False)
    assert [t.train for t in conv.turns if t.role == "assistant"] == [False] + [True] * (len(asst) - 1)
    assert [t.train for t in conv.turns if t.role == "tool"] == [False, False]


def test_malformed_rows_counted_with_row_numbers(tok, tmp_path):
    good = json.loads(PARTS.read_text().splitlines()[0])
    image = {"messages": [{"role": "user", "content": [{"type": "image", "image": "a.jpg"}]},
                          good["messages"][1]]}
    half = {"messages": [good["messages"][0], dict(good["messages"][1], loss_weight=0.5)]}
    bot = {"conversations": [{"from": "human", "value": "hi"}, {"from": "bot", "value": "hello"}]}
    p = tmp_path / "mixed.jsonl"
    p.write_text("\n".join([json.dumps(good), json.dumps(image), json.dumps(half), "{oops", json.dumps(good)]) + "\n")
    rep = tokenize_dataset(_recipe(p).data, tok).report
    assert rep.format == "chat" and rep.rows == 5 and rep.bad_rows == 3 and rep.examples == 2
    s = " | ".join(rep.bad_row_samples)
    assert "row 2: messages[0].content[0].type 'image' is not supported" in s
    assert "row 3: messages[1].loss_weight 0.5: only 0 or 1" in s
    assert "row 4: not valid JSON" in s
    q = _write_jsonl(tmp_path / "sg.jsonl", [bot, json.loads(SHAREGPT.read_text())[0]])
    rep = tokenize_dataset(_recipe(q).data, tok).report
    assert rep.format == "sharegpt" and rep.bad_rows == 1 and "row 1: conversations[1].from 'bot' is not one of" \
        in rep.bad_row_samples[0] and "data.sharegpt.roles" in rep.bad_row_samples[0]


def test_alpaca_system_and_history(tok):
    rows = json.loads(ALPACA_H.read_text())
    td = tokenize_dataset(_recipe(ALPACA_H).data, tok)
    assert td.report.format == "alpaca" and td.report.rows == 4 and td.report.bad_rows == 0
    r = rows[1]
    e = next(x for x in td.examples if x.source == 2)
    want = []
    for _, a in r["history"]:   # history responses are learned, as LLaMA-Factory documents
        want += _enc(tok, a + "\n\n")
    assert _kept(e) == want + _enc(tok, r["output"]) + [tok.eos_token_id]
    ids = e.input_ids.tolist()
    sys_ids = _enc(tok, r["system"] + "\n\n")
    assert ids[1:1 + len(sys_ids)] == sys_ids and all(l == IGNORE_INDEX for l in e.labels[:1 + len(sys_ids)])
    plain = next(x for x in td.examples if x.source == 4)   # no system, no history: the prompt template as before
    template = _recipe(ALPACA_H).data.prompt_template
    prompt = 1 + len(_enc(tok, template.format(instruction=rows[3]["instruction"])))
    assert (plain.labels[:prompt] == IGNORE_INDEX).all() and (plain.labels[prompt:] != IGNORE_INDEX).all()


@pytest.fixture(scope="module")
def tables(tmp_path_factory):
    """The ShareGPT sample as a HF datasets directory (two splits) and as a Parquet file."""
    import datasets

    rows = json.loads(SHAREGPT.read_text())
    root = tmp_path_factory.mktemp("tables")
    ds = datasets.Dataset.from_list(rows)
    ds.save_to_disk(str(root / "one"))
    datasets.DatasetDict({"train": ds, "test": ds.select([0, 1])}).save_to_disk(str(root / "two"))
    ds.to_parquet(str(root / "rows.parquet"))
    return root


def test_datasets_directory_and_parquet_read_like_the_json(tok, tables, tmp_path):
    ref = tokenize_dataset(_recipe(SHAREGPT).data, tok)
    for p in (tables / "one", tables / "rows.parquet", tables / "two"):
        td = tokenize_dataset(_recipe(p).data, tok)
        assert td.report.format == "sharegpt" and td.report.rows == 6 and td.report.bad_rows == 0, p
        assert [e.input_ids.tolist() for e in td.examples] == [e.input_ids.tolist() for e in ref.examples]
        assert [e.labels.tolist() for e in td.examples] == [e.labels.tolist() for e in ref.examples]
        assert len(td.report.sha256) == 64
    assert tokenize_dataset(_recipe(tables / "two", split="test").data, tok).report.rows == 2
    with pytest.raises(RecipeError, match=r"data.split: .* has splits \['test', 'train'\], not 'dev'"):
        tokenize_dataset(_recipe(tables / "two", split="dev").data, tok)
    junk = tmp_path / "junk.parquet"
    junk.write_bytes(b"PAR1 not really")
    with pytest.raises(RecipeError, match="not a readable HF datasets directory or Parquet file"):
        tokenize_dataset(_recipe(junk, format="sharegpt").data, tok)


@pytest.mark.parametrize("bound,value,match", [
    ("MAX_TABLE_ROWS", 5, r"rows 6, more than the 5 port reads \(porting.train.data.tables.MAX_TABLE_ROWS\)"),
    ("MAX_TABLE_BYTES", 100, r"holds more bytes than [\d,]+, more than the 100 port reads .*MAX_TABLE_BYTES"),
])
def test_tables_are_bounded_in_rows_and_bytes(tok, tables, monkeypatch, bound, value, match):
    from porting.train.data import tables as tbl

    monkeypatch.setattr(tbl, bound, value)
    for p in (tables / "one", tables / "rows.parquet", tables / "two"):
        with pytest.raises(RecipeError, match=match) as err:
            tokenize_dataset(_recipe(p).data, tok)
        assert str(err.value).startswith(f"data.path: {p}: ") and "\n" not in str(err.value)


def test_parquet_bounded_by_its_uncompressed_size_before_decoding(tok, tmp_path, monkeypatch):
    """A small file that inflates: the footer's uncompressed size is checked, not only the bytes on disk."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from porting.train.data import tables as tbl

    p = tmp_path / "inflates.parquet"
    pq.write_table(pa.table({"text": ["a" * 200_000 + str(i) for i in range(20)]}), p, compression="zstd",
                   use_dictionary=False)
    size = p.stat().st_size
    monkeypatch.setattr(tbl, "MAX_TABLE_BYTES", 1 << 20)
    assert size < (1 << 20) < pq.ParquetFile(str(p)).metadata.row_group(0).total_byte_size
    with pytest.raises(RecipeError, match=r"uncompressed bytes [\d,]+, more than the 1,048,576 .*MAX_TABLE_BYTES"):
        tokenize_dataset(_recipe(p, format="text").data, tok)


# --------------------------------------------------------------------------- training on each format
@pytest.fixture(scope="module")
def trainer():
    """One real stories260K trainer (MindSpore, CPU, graph mode) whose single compiled shape (2, 256)
    takes steps from every format."""
    import logging

    from porting.train.run import loop

    from porting.train.run.step import runtime

    from porting.train.run.step import setup

    r = _recipe(SHAREGPT, max_seq_length=256, long_text="truncate")
    r = validate_recipe({**r.model_dump(mode="json"), "batching": {"micro_batch_size": 2, "bucketing": {"enabled": False}},
                         "optimizer": {"lr": 1e-3}})
    runtime.configure_mindspore(r, False)
    _, model, _ = setup.build_model(r, EMBEDDED)
    return loop.Trainer(r, ROOT, 0, 1, model, EMBEDDED, None, logging.getLogger("test_formats")), r


@pytest.mark.parametrize("path,extra", [(SHAREGPT, {}), (PARTS, {}), (REASON, {}), (ALPACA_H, {}),
                                        ("parquet", {}), (ALPACA_H, {"chat_template": "qwen2"})],
                         ids=["sharegpt", "openai-parts", "reasoning-tools", "alpaca-history", "parquet",
                              "alpaca-chat-template"])
def test_each_format_trains_on_stories260k(tok, trainer, tables, tmp_path, path, extra):
    tr, base = trainer
    if path == "parquet":
        path = tables / "rows.parquet"
    if extra.get("chat_template") == "qwen2":
        from tests.train.chat_tokenizers import templates

        f = tmp_path / "qwen2.jinja"
        f.write_text(templates()["qwen2"]["template"])
        extra = {"chat_template": str(f)}
    raw = base.model_dump(mode="json")
    raw["data"] = {**raw["data"], "path": str(path), "format": "auto", **extra}
    r = validate_recipe(raw)
    plan = build_plan(r, tok)
    step = plan.step(0, 0)
    assert {mb.shape for mb in step.micro_batches} == {(2, 256)} and step.global_tokens > 0
    losses = [tr.run_step(step, 1e-3).loss for _ in range(3)]   # the same batch three times: it is learned
    assert all(np.isfinite(losses)) and losses[-1] < losses[0], losses


def test_port_train_reads_a_datasets_directory(tables, tmp_path):
    run = tmp_path / "run"
    r = port("train", "recipes/tiny-cpu.yaml", "--set", f"data.path={tables / 'one'}", "--set", "data.format=auto",
             "--set", "data.long_text=truncate", "--set", "data.max_seq_length=256", "--set",
             "batching.bucketing.enabled=false", "--set", "batching.micro_batch_size=2", "--set",
             "schedule.max_steps=3", "--set", "checkpointing.export_hf=false", "--run-dir", str(run), check=True)
    steps, summary = metrics(run)
    assert len(steps) == 3 and all(np.isfinite(s["loss"]) for s in steps) and summary["steps"] == 3
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["data"]["format"] == "sharegpt" and manifest["data"]["rows"] == 6
    bad = port("train", "recipes/tiny-cpu.yaml", "--set", f"data.path={tmp_path / 'nope'}", "--run-dir",
               str(tmp_path / "run2"))
    assert bad.returncode == 2 and "data.path: file not found" in error_line(bad) and r.returncode == 0
