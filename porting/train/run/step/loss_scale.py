"""Loss scaling for fp16/bf16 on Ascend: static, dynamic (halve on overflow, double after a window of good
steps, as MindSpore's DynamicLossScaleUpdateCell and Megatron-LM's DynamicGradScaler do), or none (a scale of 1)."""

from __future__ import annotations

from porting.train.run.checkpoint import save as ckpt


class LossScaler:
    """Static or dynamic loss scaling (fp16/bf16 on Ascend); ``none`` is a scale of 1."""
    def __init__(self, cfg, state: ckpt.TrainState | None = None):
        self.kind = cfg.kind
        self.scale = 1.0 if cfg.kind == "none" else float(cfg.init)
        self.factor, self.window = cfg.factor, cfg.window
        self.good = 0
        if state:
            self.scale, self.good = state.loss_scale, state.good_steps

    def update(self, finite: bool) -> bool:
        """True when the step counts; False when it was skipped for overflow (dynamic scaling)."""
        if self.kind != "dynamic":
            return finite
        if not finite:
            self.scale = max(1.0, self.scale / self.factor)
            self.good = 0
            return False
        self.good += 1
        if self.good >= self.window:
            self.scale *= self.factor
            self.good = 0
        return True
