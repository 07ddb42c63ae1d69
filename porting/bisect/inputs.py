"""What a bisection runs on: the MindSpore weights (a `port convert` directory, a `port train`
checkpoint, or a run directory's latest checkpoint), the config each side uses, and the fixed batch."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np

from model_zoo.config import LlamaConfig
from model_zoo.errors import CheckpointError, ConfigError
from porting.rundir.paths import RunDir

# Config fields that decide tensor shapes: a difference is refused (the two sides are not the same model).
SHAPE_FIELDS = ("hidden_size", "intermediate_size", "num_hidden_layers", "num_attention_heads",
                "num_key_value_heads", "vocab_size", "head_dim", "tie_word_embeddings", "qkv_bias", "o_bias",
                "mlp_bias")
MAX_IDS = 1 << 16        # tokens in one bisection batch (it is one forward and backward, not an epoch)
MAX_DATA_BYTES = 8 << 20


@dataclasses.dataclass(frozen=True)
class MsWeights:
    """Where the MindSpore side's weights come from: ``kind`` "convert" (a port convert directory, its
    own config.json) or "checkpoint" (a per-rank `port train` checkpoint, the HF directory's config)."""

    kind: str
    path: Path
    cfg: LlamaConfig


def _latest_checkpoint(run: Path) -> Path:
    from porting.train.run.checkpoint import save as ckpt

    root = RunDir(run).checkpoints
    steps = sorted((int(m.group(1)), p) for p in (root.iterdir() if root.is_dir() else [])
                   if (m := ckpt.STEP_DIR.match(p.name)) and _is_train_checkpoint(p))
    if not steps:
        raise CheckpointError(f"{run}: a run directory without checkpoints (no {root.name}/step_N/"
                              f"{ckpt.LAYOUT_FILE}); set checkpointing.every_steps in the recipe, or pass "
                              "--ms a `port convert` output")
    return steps[-1][1]


def _is_train_checkpoint(p: Path) -> bool:
    """A per-rank `port train` checkpoint (its layout record, porting/train/run/checkpoint/format.py)."""
    from porting.train.run.checkpoint import save as ckpt  # deferred: the run side imports MindSpore

    return (p / ckpt.LAYOUT_FILE).is_file()


def resolve_ms(ms: str | Path, hf_cfg: LlamaConfig) -> MsWeights:
    """The MindSpore weights behind ``--ms`` (one-line CheckpointError when it is none of the three)."""
    from porting.train.run.checkpoint import save as ckpt

    p = Path(ms)
    if not p.is_dir():
        raise CheckpointError(f"{p}: --ms expects a directory (a `port convert` output, a `port train` run "
                              "directory or one of its checkpoints/step_N); nothing is there")
    if RunDir(p).checkpoints.is_dir() or RunDir(p).metrics.is_file():
        p = _latest_checkpoint(p)
    if _is_train_checkpoint(p):
        return MsWeights("checkpoint", p, hf_cfg)
    if (p / "config.json").is_file():
        return MsWeights("convert", p, LlamaConfig.from_hf(p))
    raise CheckpointError(f"{p}: neither a `port convert` output (no config.json) nor a `port train` checkpoint "
                          f"(no {ckpt.LAYOUT_FILE}); pass --ms the directory port wrote")


def config_notes(hf: LlamaConfig, ms: LlamaConfig, where: Path) -> list[str]:
    """Differences that change numbers but not shapes (rope_theta, rms_norm_eps, ...), as notes; a
    difference in shape is refused."""
    shape = [f"{k} ({getattr(hf, k)!r} vs {getattr(ms, k)!r})" for k in SHAPE_FIELDS if getattr(hf, k) != getattr(ms, k)]
    if shape:
        raise ConfigError(f"{where}/config.json: a different model from the HF directory's: {', '.join(shape)}; "
                          "pass the checkpoint converted from this HF directory")
    return [f"config.json differs from the HF directory's: {k} = {getattr(ms, k)!r} (HF: {getattr(hf, k)!r})"
            for k in hf.__dataclass_fields__ if k not in SHAPE_FIELDS and getattr(hf, k) != getattr(ms, k)]


def batch_ids(cfg: LlamaConfig, hf_dir: Path, *, ids: list[int] | None, data: str | None, batch: int, seq: int,
              seed: int) -> np.ndarray:
    """(batch, seq) token ids: given ids (one row), the first tokens of a text file (tokenized with the
    HF directory's tokenizer), or the seeded probe ids of `port verify`."""
    from porting.verify.parity import probe_ids

    if batch < 1 or seq < 2 or batch * seq > MAX_IDS:
        raise ConfigError(f"--batch {batch} x --seq {seq}: expected batch >= 1, seq >= 2 and at most {MAX_IDS} tokens")
    seq = min(seq, cfg.max_position_embeddings)
    if ids is not None:
        if len(ids) > cfg.max_position_embeddings:   # checked before anything is allocated
            raise ConfigError(f"--ids: {len(ids):,} ids, more than the model's max_position_embeddings "
                              f"{cfg.max_position_embeddings:,} (config.json); pass at most that many")
        out = np.asarray([ids], np.int64)
        if out.shape[1] < 2 or out.size > MAX_IDS:
            raise ConfigError(f"--ids: {out.shape[1]} ids; expected 2 to {MAX_IDS}")
    elif data is not None:
        out = _ids_from_text(hf_dir, data, batch, seq)
    else:
        return probe_ids(cfg.vocab_size, batch, seq, seed, cfg.bos_token_id)
    bad = out[(out < 0) | (out >= cfg.vocab_size)]
    if bad.size:
        raise ConfigError(f"--ids: token id {int(bad[0])} is outside the vocabulary [0, {cfg.vocab_size}); "
                          "pass ids of this model's tokenizer")
    return out


def _ids_from_text(hf_dir: Path, data: str, batch: int, seq: int) -> np.ndarray:
    from model_zoo.files import read_text
    from porting.tokenizer import load_tokenizer

    text = read_text(data, what="--data text file", max_bytes=MAX_DATA_BYTES, error=ConfigError)
    tokens = load_tokenizer(hf_dir)(text[: MAX_DATA_BYTES])["input_ids"]
    if len(tokens) < batch * seq:
        raise ConfigError(f"{data}: {len(tokens)} tokens, a batch of {batch} x {seq} needs {batch * seq}; "
                          "pass a longer file or a smaller --batch/--seq")
    return np.asarray(tokens[: batch * seq], np.int64).reshape(batch, seq)
