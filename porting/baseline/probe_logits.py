"""The logits of a `port train` run on the baseline's probe batch (`port compare`): the run's weights
after the baseline's last step, loaded into the zoo's MindSpore cell, run on the probe ids (float32).

Where the weights come from, in order: ``checkpoints/step_<N>/`` when the run kept step N (N = the
baseline's last step; the architecture from the manifest's model.config), else ``hf/`` (the HF export written at the end) when the run's last step is N.
Anything else is reported as "not available" with the reason, never silently substituted.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from porting.rundir import RunRecords


def logits_from_hf(hf_dir: Path, ids: np.ndarray) -> np.ndarray:
    import mindspore as ms

    from porting.verify.pair import load_zoo

    model = load_zoo(hf_dir)
    model.set_train(False)
    return model(ms.Tensor(ids.astype(np.int32))).asnumpy().astype(np.float32)


def _logits_from_ckpt(ckpt_dir: Path, cfg_source, ids: np.ndarray) -> np.ndarray:
    """The model parameters of a per-rank `port train` checkpoint (porting/train/run/checkpoint/format.py; a directory
    without its layout record is refused in one line by the reader), every tensor whole."""
    import mindspore as ms

    from model_zoo.config import LlamaConfig
    from model_zoo.errors import CheckpointError
    from model_zoo.llama import build
    from porting.train.run.checkpoint.read import full_state

    state = full_state(ckpt_dir)
    model = build(LlamaConfig.from_hf(cfg_source), param_dtype="float32")
    for p in model.get_parameters():
        if p.name not in state or tuple(state[p.name].shape) != tuple(p.shape):
            raise CheckpointError(f"{ckpt_dir}: {p.name} is missing or has another shape; expected a "
                                  "checkpoint of this model")
        p.set_data(ms.Tensor(state[p.name]).astype(p.dtype))
    model.set_train(False)
    return model(ms.Tensor(ids.astype(np.int32))).asnumpy().astype(np.float32)


def _is_lora(ckpt: Path) -> bool:
    from porting.train.run.checkpoint.lora_export import lora_recipe

    return lora_recipe(ckpt) is not None


def run_probe_logits(run: RunRecords, ids: np.ndarray, after_step: int) -> tuple[np.ndarray | None, str]:
    """(logits, where they came from) or (None, why there are none)."""
    ckpt = run.path / "checkpoints" / f"step_{after_step}"
    hf = run.path / "hf"
    cfg = run.manifest.model.config if run.manifest else None
    if ckpt.is_dir() and _is_lora(ckpt):   # adapters only: the merged export holds the base with them
        if run.last_step == after_step and (hf / "config.json").is_file():
            return logits_from_hf(hf, ids), f"{hf} (the base with the adapter merged)"
        return None, (f"{ckpt} holds a LoRA adapter only and the run's merged export {hf} is not after step "
                      f"{after_step}; compare the whole run, or merge that step (port ckpt merge {ckpt} --model BASE)")
    if ckpt.is_dir() and (isinstance(cfg, dict) or (hf / "config.json").is_file()):
        return _logits_from_ckpt(ckpt, cfg if isinstance(cfg, dict) else hf, ids), f"{ckpt}"
    if hf.is_dir() and (hf / "config.json").is_file():
        if run.last_step != after_step:
            return None, (f"run's HF export is after step {run.last_step}, baseline probe is after step {after_step}, "
                          f"and {ckpt} is absent")
        return logits_from_hf(hf, ids), f"{hf}"
    return None, f"no {hf} export and no {ckpt} in the run"
