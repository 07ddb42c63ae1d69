"""LoRA as issue 52's "done" states it, on a Llama and a Qwen3 checkpoint (random weights saved by
transformers, fp32, dropout 0, r 8, all-linear), both in this process:

- 50 steps of `port train` with a ``lora`` section equal `port baseline run` (HF peft, the same batches, the same
  initial adapter file): every step's loss within 1e-5 absolute, the trained adapters within 1e-5 max abs; the
  Qwen3 run with use_rslora;
- the exported adapter (``RUN/adapter``) loads in ``PeftModel.from_pretrained`` over the HF base with no missing
  or unexpected key, its logits equal the merged checkpoint's (``RUN/hf``, which transformers loads) within 1e-4;
- `port compare` passes with the adapters' settings like for like (the initial adapters' sha256 equal).
"""

from __future__ import annotations

import json

import numpy as np
import pytest

from benchmarks.model_cards import write_random
from tests.train.conftest import TINY, metrics
from tests.train.test_qwen3_train import write_qwen3

pytestmark = pytest.mark.slow
STEPS = 50


def write_llama(out, seed: int = 0):
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=512, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                   num_attention_heads=8, num_key_value_heads=4, max_position_embeddings=256,
                                   bos_token_id=1, eos_token_id=2, tie_word_embeddings=False)
    return write_random(cfg, out, seed)


def _sets(hf, *extra: str) -> list[str]:
    return [f"model.source={hf}", "data.max_seq_length=64", f"schedule.max_steps={STEPS}", "schedule.epochs=100",
            "checkpointing.every_steps=0", "lora.r=8", "lora.alpha=16", "lora.target_modules=all-linear", *extra]


def _pair(hf, tmp, *extra: str):
    """The PEFT baseline and the port run of the same LoRA recipe: (baseline document, its adapter, run dir)."""
    from porting.baseline.runner import BaselineRequest, run
    from porting.train import load_recipe, train

    sets = _sets(hf, *extra)
    base = run(BaselineRequest(recipe_path=str(TINY), out=str(tmp / "base.json"), overrides=tuple(sets), threads=1,
                               adapter_out=str(tmp / "base_adapter")))
    train(load_recipe(TINY, sets), tmp / "run", echo=False)
    return base, tmp / "base_adapter", tmp / "run"


def _check(base, base_adapter, run, hf) -> None:
    from safetensors.numpy import load_file

    steps = [s for s in metrics(run)[0]]
    assert len(steps) == STEPS == len(base.losses)
    diffs = [abs(s["loss"] - b) for s, b in zip(steps, base.losses)]
    assert max(diffs) < 1e-5, max(diffs)
    ours, theirs = (load_file(str(d / "adapter_model.safetensors")) for d in (run / "adapter", base_adapter))
    assert ours.keys() == theirs.keys()
    assert max(float(np.abs(ours[k] - theirs[k]).max()) for k in ours) < 1e-5
    assert max(float(np.abs(ours[k]).max()) for k in ours if "lora_B" in k) > 1e-3, "the adapters did not move"
    init = load_file(str(run / "adapter_init" / "adapter_model.safetensors"))
    assert init.keys() == ours.keys()
    _peft_loads_and_merges(run, hf)


def _peft_loads_and_merges(run, hf) -> None:
    import torch
    import transformers
    from peft import PeftModel
    from peft.utils import set_peft_model_state_dict
    from safetensors.torch import load_file

    pm = PeftModel.from_pretrained(transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32),
                                   str(run / "adapter"))
    res = set_peft_model_state_dict(pm, load_file(str(run / "adapter" / "adapter_model.safetensors")))
    assert [k for k in res.missing_keys if ".lora_" in k] == [] and list(res.unexpected_keys) == []
    merged = transformers.AutoModelForCausalLM.from_pretrained(run / "hf", dtype=torch.float32)
    ids = torch.randint(0, 512, (2, 48), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        a, b = pm(input_ids=ids).logits, merged(input_ids=ids).logits
    assert float((a - b).abs().max()) < 1e-4
    plain = transformers.AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32)
    with torch.no_grad():
        assert float((plain(input_ids=ids).logits - b).abs().max()) > 1e-3, "the merge changed nothing"


def test_llama_lora_matches_peft_step_for_step(tmp_path):
    hf = write_llama(tmp_path / "hf")
    base, adapter, run = _pair(hf, tmp_path)
    _check(base, adapter, run, hf)
    from porting.baseline.compare import run_compare

    cmp = run_compare(str(tmp_path / "base.json"), str(run))
    assert cmp.ok and cmp.settings.differ == (), cmp.failures
    doc = json.loads((tmp_path / "base.json").read_text())
    assert doc["settings"]["adapter"]["init_sha256"] and doc["settings"]["adapter"]["r"] == 8


def test_qwen3_rslora_matches_peft_step_for_step(tmp_path):
    hf = write_qwen3(tmp_path / "hf")
    base, adapter, run = _pair(hf, tmp_path, "lora.use_rslora=true", "lora.modules_to_save=[input_layernorm,lm_head]")
    _check(base, adapter, run, hf)
    cfg = json.loads((run / "adapter" / "adapter_config.json").read_text())
    assert cfg["use_rslora"] is True and cfg["r"] == 8 and len(cfg["target_modules"]) == 14
    assert cfg["modules_to_save"] == ["input_layernorm", "lm_head"]
