"""Every key of a CUDA job's config, mapped onto the port recipe or refused with the reason, as data.

Sources: HF ``TrainingArguments`` (transformers/training_args.py), DeepSpeed's JSON
(https://www.deepspeed.ai/docs/config-json/), accelerate's ``default_config.yaml``
(accelerate/commands/config/config_args.py) and LLaMA-Factory's YAML (src/llamafactory/hparams/*.py:
model, data, finetuning and generating arguments on top of ``Seq2SeqTrainingArguments``).

A key becomes one of:
* a job field (``FIELDS``): what the run did (micro-batch, lr, schedule, precision, ...), from which
  :mod:`porting.intake.recipe_import` writes the recipe and records the recipe key it became;
* refused, with the reason, blocking (port cannot train what the job trained: QLoRA, DoRA, ZeRO-3 offload,
  an optimizer other than AdamW) or not (the key does not change the trained weights, or port has its
  own way: logging, saving, the hub, loader workers).
"""

from __future__ import annotations

from typing import Any

from porting.intake import lora_keys
from porting.intake.typed import Flag, Num, Pair, Spec, Text

# source key (dotted for nested) -> job field; the recipe key each field becomes is FIELD_TARGET
FIELDS = {
    "per_device_train_batch_size": "micro_batch", "train_micro_batch_size_per_gpu": "micro_batch",
    "gradient_accumulation_steps": "grad_accum", "train_batch_size": "source_global_batch",
    "num_processes": "source_gpus", "_n_gpu": "gpus_per_process",
    "learning_rate": "lr", "optimizer.params.lr": "lr", "adam_beta1": "beta1", "adam_beta2": "beta2",
    "optimizer.params.betas": "betas", "adam_epsilon": "eps", "optimizer.params.eps": "eps",
    "weight_decay": "weight_decay", "optimizer.params.weight_decay": "weight_decay",
    "max_grad_norm": "grad_clip", "gradient_clipping": "grad_clip",
    "lr_scheduler_type": "scheduler", "warmup_steps": "warmup_steps", "warmup_ratio": "warmup_ratio",
    "num_train_epochs": "epochs", "max_steps": "max_steps", "seed": "seed",
    "bf16": "bf16", "bf16.enabled": "bf16", "fp16": "fp16", "fp16.enabled": "fp16", "mixed_precision": "mixed_precision",
    "fp16.loss_scale": "loss_scale", "fp16.loss_scale_window": "loss_scale_window",
    "fp16.initial_scale_power": "initial_scale_power",
    "gradient_checkpointing": "recompute", "optim": "optim", "optimizer.type": "optim",
    "zero_optimization.stage": "zero_stage", "zero_optimization.reduce_bucket_size": "reduce_bucket_size",
    "model_name_or_path": "model", "dataset": "dataset", "template": "template",
    "cutoff_len": "max_len", "max_seq_length": "max_len", "model_max_length": "max_len",
    "output_dir": "output_dir", "logging_steps": "logging_steps", "save_steps": "save_steps",
    "save_total_limit": "keep_last", "report_to": "report_to", "val_size": "eval_split", "eval_steps": "eval_steps",
    "ddp_timeout": "timeout", "packing": "packing", "group_by_length": "group_by_length",
    "stage": "stage", "finetuning_type": "finetuning_type", "distributed_type": "distributed_type",
    "num_machines": "source_nodes", **lora_keys.FIELDS,
}

FIELD_TARGET = {
    "micro_batch": "batching.micro_batch_size (re-derived with the global batch)",
    "grad_accum": "batching.grad_accum_steps (re-derived with the global batch)",
    "source_global_batch": "global batch (micro x accumulation x data parallel)",
    "source_gpus": "global batch (data-parallel GPUs of the CUDA job)",
    "source_nodes": "global batch (nodes of the CUDA job; num_processes counts all GPUs)",
    "gpus_per_process": "global batch (GPUs of one process)",
    "lr": "optimizer.lr", "beta1": "optimizer.betas[0]", "beta2": "optimizer.betas[1]", "betas": "optimizer.betas",
    "eps": "optimizer.eps", "weight_decay": "optimizer.weight_decay", "grad_clip": "optimizer.grad_clip",
    "scheduler": "schedule.decay, schedule.min_lr_ratio", "warmup_steps": "schedule.warmup_steps",
    "warmup_ratio": "schedule.warmup_steps (ratio x schedule.max_steps)", "epochs": "schedule.epochs",
    "max_steps": "schedule.max_steps", "seed": "seed",
    "bf16": "precision.param_dtype, precision.compute_dtype", "fp16": "precision.*, precision.loss_scale",
    "mixed_precision": "precision.param_dtype, precision.compute_dtype",
    "loss_scale": "precision.loss_scale.kind", "loss_scale_window": "precision.loss_scale.window",
    "initial_scale_power": "precision.loss_scale.init", "recompute": "memory.recompute",
    "optim": "optimizer.name", "zero_stage": "parallel.optimizer_sharding, parallel.zero_stage",
    "reduce_bucket_size": "parallel.comm_fusion.allreduce_config (MB)", "model": "model.source",
    "dataset": "data.path", "template": "data.chat_template", "max_len": "data.max_seq_length",
    "output_dir": "output_dir", "logging_steps": "logging.every_steps", "save_steps": "checkpointing.every_steps",
    "keep_last": "checkpointing.keep_last", "report_to": "logging.tensorboard, logging.wandb",
    "eval_split": "data.eval_split", "eval_steps": "data.eval_every_steps", "timeout": "cluster.cluster_time_out",
    "packing": "batching.packing", "group_by_length": "batching.bucketing.enabled",
    "stage": "(full fine-tuning of a causal LM: sft, pt)", "finetuning_type": "full fine-tuning, or the lora section",
    "distributed_type": "parallel (data parallel; ZeRO -> optimizer sharding)", **lora_keys.TARGET,
}

# each job field's type and range, stated once (porting/intake/typed.py applies them to every file's value).
# Ranges are the recipe's own where the field becomes a recipe key (docs/promises.md 3.3), else what the source
# type allows: HF TrainingArguments (logging/save/eval_steps are floats, a value below 1 a ratio of the
# total steps; max_steps -1 means "from the epochs"; save_total_limit and ddp_timeout ints), DeepSpeed's
# JSON (zero_optimization.stage 0..3; fp16.initial_scale_power an exponent of 2: the recipe's loss-scale init
# is at most 2**32), LLaMA-Factory's val_size (a fraction, or a count of examples).
_STEPS = Num(0, 1e9)
TYPES: dict[str, Spec] = {
    "micro_batch": Num(1, 65_536, whole=True), "grad_accum": Num(1, 65_536, whole=True),
    "source_global_batch": Num(1, 1 << 24, whole=True), "source_gpus": Num(1, 1 << 20, whole=True),
    "gpus_per_process": Num(0, 1024, whole=True), "source_nodes": Num(1, 4096, whole=True),
    "lr": Num(0, 1e30, low_open=True), "beta1": Num(0, 1, high_open=True), "beta2": Num(0, 1, high_open=True),
    "betas": Pair(Num(0, 1, high_open=True)), "eps": Num(0, 1, low_open=True), "weight_decay": Num(0, 10),
    "grad_clip": Num(0, 1e6), "scheduler": Text(), "warmup_steps": Num(0, 1e9, whole=True),
    "warmup_ratio": Num(0, 1), "epochs": Num(0, 1e6, low_open=True), "max_steps": Num(-1, 1e9, whole=True),
    "seed": Num(0, 2 ** 32 - 1, whole=True), "bf16": Flag(), "fp16": Flag(), "mixed_precision": Text(),
    "loss_scale": Num(0, 2 ** 32), "loss_scale_window": Num(1, 1e9, whole=True),
    "initial_scale_power": Num(0, 32, whole=True), "recompute": Flag(), "optim": Text(),
    "zero_stage": Num(0, 3, whole=True), "reduce_bucket_size": Num(0, 1e12), "model": Text(),
    "dataset": Text(many=True), "template": Text(), "max_len": Num(8, 1_048_576, whole=True), "output_dir": Text(),
    "logging_steps": _STEPS, "save_steps": _STEPS, "keep_last": Num(0, 1e6, whole=True), "report_to": Text(many=True),
    "eval_split": Num(0, 1e9), "eval_steps": _STEPS, "timeout": Num(0, 1e12, whole=True), "packing": Flag(),
    "group_by_length": Flag(), "stage": Text(), "finetuning_type": Text(), "distributed_type": Text(),
    **lora_keys.TYPES,
}

# optimizer names port trains with (torch AdamW semantics), from HF OptimizerNames and DeepSpeed types
ADAMW = {"adamw_torch", "adamw_torch_fused", "adamw_hf", "adamw_apex_fused", "adamw", "adam", "adamw_torch_xla"}
SCHEDULERS = {"cosine": ("cosine", 0.0), "linear": ("linear", 0.0), "constant": ("constant", 1.0),
              "constant_with_warmup": ("constant", 1.0)}   # HF decays to 0 (transformers/optimization.py)

BLOCKING = {
    **lora_keys.BLOCKING,   # QLoRA, DoRA, LoRA+, PiSSA, an adapter path (porting/intake/lora_keys.py)
    "zero_optimization.offload_optimizer.device": "ZeRO offload of optimizer states to the CPU: port keeps them on the device (sharded over data-parallel ranks)",
    "zero_optimization.offload_param.device": "ZeRO-3 offload of parameters to the CPU: port keeps parameters on the device",
    "label_smoothing_factor": "label smoothing: port's loss is plain token cross-entropy",
    # NEFTune adds uniform noise of alpha / sqrt(L x d) to the input embeddings every training step (transformers
    # Trainer neftune_noise_alpha, Jain et al. 2023): the trained weights differ; port adds none (model_zoo/llama.py)
    "neftune_noise_alpha": "NEFTune embedding noise: port adds no noise to the input embeddings; drop it from the job "
                           "(the losses of the two sides would differ by the noise) or train it on the GPU",
}
# keys that do not change the trained weights (or port has its own way), by family
NO_EFFECT_PREFIXES = {
    "logging/reporting": ("logging_", "log_", "report", "disable_tqdm", "plot_loss", "run_name", "include_",
                          "skip_memory_metrics", "steps_per_print", "wall_clock_breakdown", "debug", "tpu_metrics"),
    "evaluation/prediction": ("eval", "do_eval", "do_predict", "per_device_eval", "per_gpu_eval", "predict",
                              "prediction_loss_only", "metric_for_best_model", "greater_is_better",
                              "load_best_model", "generation_", "sortish", "label_names", "past_index",
                              "jit_mode_eval", "fp16_full_eval", "bf16_full_eval", "batch_eval_metrics", "compute_accuracy"),
    "saving/hub": ("save_", "push_to_hub", "hub_", "overwrite_output_dir", "resume_from_checkpoint", "ignore_data_skip",
                   "stage3_gather_16bit_weights_on_model_save", "export_", "overwrite_cache"),
    "data loading": ("dataloader_", "preprocessing_num_workers", "remove_unused_columns", "length_column_name",
                     "max_samples", "tokenized_path", "streaming", "mix_strategy", "data_seed", "dispatch_batches",
                     "split_batches", "accelerator_config", "mask_history", "train_on_prompt"),
    "launcher/runtime": ("do_train", "local_rank", "ddp_", "no_cuda", "use_cpu", "use_mps_device", "use_ipex",
                         "tpu_", "xpu_backend", "ray_scope", "compute_environment", "machine_rank",
                         "main_training_function", "rdzv_backend", "same_network", "main_process_", "gpu_ids",
                         "dynamo_", "distributed_state", "deepspeed_plugin", "mp_parameters", "torchdynamo",
                         "half_precision_backend", "fp16_backend", "fp16_opt_level", "__class__", "trust_remote_code",
                         "enable_cpu_affinity", "full_determinism", "auto_find_batch_size", "use_kt", "use_legacy",
                         "per_gpu_train_batch_size", "zero_allow_untested_optimizer", "downcast_bf16", "hf_hub_token",
                         "optim_args", "average_tokens_across_devices", "restore_callback_states",
                         "flash_attn", "enable_liger_kernel", "use_unsloth", "adafactor_", "torch_empty_cache_steps"),
    "communication tuning (MindSpore schedules overlap itself)": (
        "zero_optimization.allgather", "zero_optimization.overlap_comm", "zero_optimization.contiguous_gradients",
        "zero_optimization.reduce_scatter", "zero_optimization.round_robin", "zero_optimization.sub_group_size",
        "zero_optimization.stage3_", "zero_optimization.offload_optimizer.pin_memory",
        "zero_optimization.offload_param.pin_memory", "gradient_predivide"),
    "loss-scaler details (port's dynamic scaler has init, factor and window)": ("fp16.hysteresis", "fp16.min_loss_scale"),
}


def no_effect_reason(key: str) -> str | None:
    for family, prefixes in NO_EFFECT_PREFIXES.items():
        if key.startswith(prefixes) or key.split(".")[-1].startswith(prefixes):
            return f"does not change the trained weights ({family}); port has its own setting where one is needed"
    return None


def special_refusal(key: str, value: Any) -> tuple[str, bool] | None:
    """(reason, blocking) for keys refused whatever else the job says; None when the key maps or is a no-op."""
    if key in BLOCKING:
        if value in (None, "", 0, "none", False) or (key == "label_smoothing_factor" and value == 0.0):
            return f"{BLOCKING[key]} (not used here: {value!r})", False
        return BLOCKING[key], True
    if key.startswith(("lora_", "pissa", "freeze_")) and key not in FIELDS:
        return ("a LoRA or freeze setting port does not reproduce (its lora section has r, alpha, dropout, "
                "target_modules, use_rslora, modules_to_save, bias; freeze fine-tuning is not implemented)"), False
    if key == "fsdp_config" or key.startswith("fsdp_config.") and key != "fsdp_config.fsdp_sharding_strategy":
        return "FSDP options (they act only when FSDP shards the model; port shards optimizer states instead)", False
    if key in ("fsdp", "fsdp_config.fsdp_sharding_strategy"):
        if value in ("", None, [], {}, False):
            return f"FSDP not used ({value!r})", False
        return ("FSDP shards parameters (ZeRO-3 style): port shards optimizer states and fp32 masters over data-parallel "
                "ranks and splits layers with tensor parallel; the recipe uses optimizer_sharding"), False
    if key == "deepspeed":
        if value in (None, ""):
            return "DeepSpeed not used", False
        return ("a path read from the config: port never follows it; pass the DeepSpeed JSON itself as another CONFIG "
                "argument"), False
    if key in ("tf32",):
        return "TF32 is an NVIDIA matmul mode; Ascend has none (its HF32 is torch_npu's); precision comes from the recipe", False
    if key in ("torch_compile", "torch_compile_backend", "torch_compile_mode"):
        return "port compiles the whole step with MindSpore graph mode; no torch.compile backend", False
    if key in ("adafactor",):
        return ("Adafactor: port has AdamW only", bool(value)) if value else ("Adafactor not used", False)
    if key in ("sharded_ddp",):
        return "fairscale sharded DDP (removed from transformers); port: optimizer sharding", False
    if key in ("scheduler.type", "scheduler.params.warmup_num_steps", "scheduler.params.total_num_steps",
               "scheduler.params.warmup_min_lr", "scheduler.params.warmup_max_lr"):
        return "a DeepSpeed scheduler: the HF lr_scheduler_type / warmup keys give port's schedule", False
    return None
