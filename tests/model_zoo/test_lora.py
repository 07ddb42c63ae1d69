"""LoRA in the zoo against HF PEFT (model_zoo/lora.py, converters/lora_names.py): the same layers adapted and
the same parameters trained as PEFT chooses for the same config, the same logits and the same gradient of every
trainable parameter for the same weights (lora_B non-zero, so the adapters are in the numbers), and the
refusals (a target naming no module, a non-linear one, lm_head, Phi-3's fused projections, a regex)."""

from __future__ import annotations

import numpy as np
import pytest

from converters import lora_names
from model_zoo.config import LlamaConfig
from model_zoo.errors import ConfigError
from model_zoo.lora_spec import LoraSpec, draw_initial, kaiming_bound
from tests.converters.conftest import make_hf


def _peft(hf_dir, **conf):
    import peft
    import torch
    import transformers

    model = transformers.AutoModelForCausalLM.from_pretrained(hf_dir, dtype=torch.float32, attn_implementation="eager")
    pm = peft.get_peft_model(model, peft.LoraConfig(task_type="CAUSAL_LM", **conf))
    torch.manual_seed(1)
    with torch.no_grad():
        for n, p in pm.named_parameters():
            if "lora_B" in n:   # PEFT starts B at zero: give it values so the adapters show in the logits
                p.normal_(0, 0.1)
    return pm


def _peft_trainable(pm) -> set[str]:
    """The keys PEFT saves for this adapter (get_peft_model_state_dict, the adapter name removed)."""
    from peft.utils import get_peft_model_state_dict

    return {"base_model.model." + k.removeprefix("base_model.model.") for k in get_peft_model_state_dict(pm)}


CASES = {   # arch -> LoraConfig
    "llama-bias": dict(r=4, lora_alpha=8, target_modules="all-linear", bias="lora_only",
                       modules_to_save=["input_layernorm"]),
    "qwen3": dict(r=3, lora_alpha=5, target_modules=["q_proj", "self_attn.o_proj", "model.layers.1.mlp.down_proj"],
                  use_rslora=True, bias="none"),
    "phi3": dict(r=2, lora_alpha=4, target_modules=["o_proj", "down_proj"], modules_to_save=["lm_head"]),
}


@pytest.mark.compat   # the oldest MindSpore, and peft's floor with transformers' (scripts/constraints-py312.txt)
@pytest.mark.parametrize("arch", sorted(CASES))
def test_zoo_lora_equals_peft_forward_and_gradients(arch, tmp_path):
    import mindspore as ms
    import torch

    from converters.loading import load_hf_dir
    from model_zoo import lora
    from model_zoo.llama import build

    conf = CASES[arch]
    hf = make_hf(tmp_path / arch, arch)
    pm = _peft(hf, **conf)
    cfg = LlamaConfig.from_hf(hf)
    t = lora_names.resolve(cfg, conf["target_modules"], conf.get("modules_to_save", ()), conf.get("bias", "none"))
    assert set(t.keys()) == _peft_trainable(pm)   # the same layers and the same trained parameters, named as PEFT
    model = build(cfg, defer_init=True)
    names = lora.apply_lora(model, LoraSpec(conf["r"], float(conf["lora_alpha"]), 0.0, conf.get("use_rslora", False)),
                            t.adapted.values(), t.trainable.values())
    load_hf_dir(model, hf)
    sd = {k.replace(".default", "").replace(".modules_to_save", ""): v.detach().numpy()
          for k, v in pm.state_dict().items()}
    keys = t.keys()
    lora.set_values(model, {z: sd[k] for k, z in keys.items() if ".lora_" in k})
    trainable = {p.name for p in model.trainable_params()}
    assert trainable == set(keys.values()) and set(names) <= trainable
    ids = np.random.default_rng(0).integers(0, cfg.vocab_size, (2, 24))
    w = np.random.default_rng(1).normal(size=(2, 24, cfg.vocab_size)).astype(np.float32)

    def loss(x):
        return (model(x) * ms.Tensor(w)).sum()

    params = list(model.trainable_params())
    out, grads = ms.value_and_grad(loss, None, params)(ms.Tensor(ids.astype(np.int32)))
    pm.train()
    logits = pm(input_ids=torch.tensor(ids)).logits
    (logits * torch.tensor(w)).sum().backward()
    assert abs(float(out.asnumpy()) - float((logits * torch.tensor(w)).sum())) < 1e-3
    theirs = {k.replace(".default", "").replace(".modules_to_save", ""): p.grad.numpy()
              for k, p in pm.named_parameters() if p.requires_grad}
    by_zoo = {z: k for k, z in keys.items()}
    for p, g in zip(params, grads):
        ref = theirs[by_zoo[p.name]]
        scale = max(float(np.abs(ref).max()), 1e-3)
        assert np.abs(g.asnumpy() - ref).max() / scale < 2e-5, (p.name, np.abs(g.asnumpy() - ref).max(), scale)


def test_all_linear_leaves_out_lm_head_and_refusals_name_the_key(tmp_path):
    from model_zoo import presets

    cfg = presets.config("llama3-8b")
    t = lora_names.resolve(cfg, "all-linear")
    assert len(t.adapted) == 7 * cfg.num_hidden_layers and "lm_head" not in t.adapted
    assert t.adapted["model.layers.3.mlp.gate_proj"] == "model.layers.3.feed_forward.w1"
    bad = {("foo",): "'foo' names no module", ("input_layernorm",): "is not a linear layer",
           ("lm_head",): "lm_head (the output layer)", ("q.*_proj",): "not a module name",
           ("__import__('os')",): "not a module name"}
    for targets, words in bad.items():
        with pytest.raises(ConfigError, match=words.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
            lora_names.resolve(cfg, list(targets))
    phi3 = LlamaConfig.from_hf(make_hf(tmp_path / "phi3", "phi3"))
    with pytest.raises(ConfigError, match="_proj is Phi-3.s fused projection"):
        lora_names.resolve(phi3, "all-linear")
    tied = LlamaConfig.from_hf(make_hf(tmp_path / "tied", "llama-mqa-tied"))
    with pytest.raises(ConfigError, match="tied embedding"):
        lora_names.resolve(tied, ["q_proj"], ["embed_tokens"])


def test_initial_draw_is_peft_kaiming_and_b_is_zero():
    import math

    import torch

    assert kaiming_bound(64) == pytest.approx(1 / 8)
    w = torch.empty(4096, 64)
    torch.nn.init.kaiming_uniform_(w, a=math.sqrt(5))   # PEFT's reset_lora_parameters
    assert float(w.abs().max()) <= kaiming_bound(64) and float(w.abs().max()) > 0.99 * kaiming_bound(64)
    shapes = {"x.lora_A.weight": (8, 64), "x.lora_B.weight": (32, 8)}
    a, b = draw_initial(shapes, 3), draw_initial(shapes, 3)
    assert np.array_equal(a["x.lora_A.weight"], b["x.lora_A.weight"]) and not a["x.lora_B.weight"].any()
    assert 0.99 / 8 < np.abs(a["x.lora_A.weight"]).max() <= 1 / 8
    assert LoraSpec(16, 32.0).scaling == 2.0 and LoraSpec(16, 32.0, use_rslora=True).scaling == 8.0
