"""LoRA jobs at intake (porting/intake/lora_keys.py): LLaMA-Factory's LoRA YAML (a real example file), its QLoRA
run (refused in one line, bf16 LoRA kept), HF TrainingArguments with the adapter_config.json PEFT itself wrote,
an ms-swift config, each key mapped or refused; a repo id that is a variant of a preset plans with that preset's
config and says so; `port intake` of a LLaMA-Factory LoRA job yields a recipe that trains."""

from __future__ import annotations

import json
import shutil

import pytest
import yaml

from porting.intake.job import run_intake
from porting.intake.recipe_import import Target, import_configs
from tests.attacks.harness import ROOT

CFG = ROOT / "tests" / "fixtures" / "cuda_jobs" / "configs"


def _rows(rep) -> dict:
    return {r["key"]: r for r in rep["keys"]}


def test_llamafactory_lora_yaml_becomes_a_lora_recipe_that_plans(tmp_path):
    out = tmp_path / "r.yaml"
    rep = import_configs([str(CFG / "lf_llama3_lora_sft.yaml")], out, Target(model="llama3-8b"))
    recipe = yaml.safe_load(out.read_text())
    assert recipe["lora"] == {"r": 8, "alpha": 16.0, "dropout": 0.0, "target_modules": "all-linear"}
    rows = _rows(rep)
    assert rows["lora_rank"]["recipe_key"] == "lora.r" and rows["lora_target"]["recipe_key"] == "lora.target_modules"
    assert rows["finetuning_type"]["status"] == "mapped" and not rep["blocking"]
    assert any("lora.alpha 16" in n and "llamafactory's default" in n for n in rep["notes"])
    assert rep["plan"]["fits"]


def test_qlora_is_refused_in_one_line_and_bf16_lora_is_what_trains(tmp_path):
    out = tmp_path / "q.yaml"
    rep = import_configs([str(CFG / "medical_full.yaml")], out, Target(model="qwen2.5-7b"))
    assert {r["key"] for r in rep["blocking"]} == {"quantization_bit", "quantization_method"}
    why = rep["blocking"][0]["reason"]
    assert "no NF4" in why and "bf16 LoRA" in why and "\n" not in why
    recipe = yaml.safe_load(out.read_text())
    assert recipe["lora"]["target_modules"] == ["q_proj", "v_proj", "k_proj", "o_proj", "gate_proj", "up_proj",
                                                "down_proj"]
    assert recipe["precision"]["param_dtype"] == "bfloat16"
    assert sum(line.startswith("# REFUSED") and "quantization_bit" in line for line in out.read_text().splitlines()) == 1


def test_training_args_with_peft_adapter_config_and_a_variant_repo_id(tmp_path):
    import peft
    import torch
    import transformers

    cfg = transformers.LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=48, num_hidden_layers=2,
                                   num_attention_heads=4, num_key_value_heads=2)
    torch.manual_seed(0)
    pm = peft.get_peft_model(transformers.LlamaForCausalLM(cfg), peft.LoraConfig(
        r=16, lora_alpha=32, target_modules=["q_proj", "v_proj"], use_rslora=True, task_type="CAUSAL_LM"))
    pm.save_pretrained(tmp_path / "job")   # PEFT's own adapter_config.json
    (tmp_path / "job" / "training_args.json").write_text(json.dumps(
        {"output_dir": "out", "per_device_train_batch_size": 2, "gradient_accumulation_steps": 4, "bf16": True,
         "learning_rate": 2e-4, "model_name_or_path": "Qwen/Qwen2.5-7B-Instruct", "max_seq_length": 1024}))
    out = tmp_path / "r.yaml"
    rep = import_configs([str(tmp_path / "job" / "training_args.json"), str(tmp_path / "job" / "adapter_config.json")],
                         out, Target(source_gpus=4))
    lo = yaml.safe_load(out.read_text())["lora"]
    assert lo["r"] == 16 and lo["alpha"] == 32.0 and lo["use_rslora"] is True
    assert sorted(lo["target_modules"]) == ["q_proj", "v_proj"] and not rep["blocking"]
    assert any("planned with the config.json of qwen2.5-7b" in n and "variant" in n for n in rep["notes"])
    doc = json.loads((tmp_path / "job" / "adapter_config.json").read_text())
    (tmp_path / "dora").mkdir()
    (tmp_path / "dora" / "adapter_config.json").write_text(json.dumps({**doc, "use_dora": True}))
    rep = import_configs([str(tmp_path / "job" / "training_args.json"), str(tmp_path / "dora" / "adapter_config.json")],
                         tmp_path / "d.yaml", Target(source_gpus=4))
    assert [r["key"] for r in rep["blocking"]] == ["use_dora"] and "DoRA" in rep["blocking"][0]["reason"]


def test_ms_swift_lora_keys(tmp_path):
    """Written from ms-swift's documented parameters (swift.readthedocs.io, Command-line-parameters)."""
    p = tmp_path / "swift_sft.yaml"
    p.write_text(yaml.safe_dump({"model": "Qwen/Qwen2.5-7B-Instruct", "train_type": "lora", "lora_rank": 8,
                                 "lora_alpha": 32, "target_modules": ["all-linear"], "lorap_lr_ratio": 16,
                                 "quant_bits": 4, "torch_dtype": "bfloat16", "per_device_train_batch_size": 1,
                                 "gradient_accumulation_steps": 16, "learning_rate": 1e-4, "max_length": 2048}))
    rep = import_configs([str(p)], tmp_path / "r.yaml", Target(model="qwen2.5-7b"))
    assert {r["key"] for r in rep["blocking"]} == {"quant_bits", "lorap_lr_ratio"}
    lo = yaml.safe_load((tmp_path / "r.yaml").read_text())["lora"]
    assert lo == {"r": 8, "alpha": 32.0, "dropout": 0.05, "target_modules": "all-linear"}
    assert any("lora.dropout 0.05" in n and "ms-swift's default" in n for n in rep["notes"])


@pytest.mark.slow
def test_port_intake_of_a_llamafactory_lora_job_yields_a_recipe_that_trains(tmp_path):
    from porting.train import load_recipe, train
    from tests.train.test_lora_train import write_llama

    job = tmp_path / "job"
    job.mkdir()
    shutil.copy(CFG / "lf_llama3_lora_sft.yaml", job / "lora_sft.yaml")
    hf = write_llama(tmp_path / "hf")
    out = tmp_path / "migration"
    run_intake(job, out, Target(model=str(hf), data=str(ROOT / "porting/train/assets/tinystories_sample.txt")))
    on_cpu = ["cluster.server=null", "cluster.chips_per_node=null", "cluster.dies_per_chip=null", "cluster.device=cpu",
              "cluster.devices_per_node=1", "parallel.tensor_parallel=1", "precision.param_dtype=float32",
              "precision.compute_dtype=float32", "data.max_seq_length=64", "schedule.max_steps=2"]
    r = train(load_recipe(out / "recipe.yaml", on_cpu), tmp_path / "run", echo=False)
    assert r.steps_done == 2
    conf = json.loads((tmp_path / "run" / "adapter" / "adapter_config.json").read_text())
    assert conf["r"] == 8 and conf["lora_alpha"] == 16.0 and len(conf["target_modules"]) == 14
