"""The settings that move a loss curve, as each side really ran them, set side by side (one table).

A side is a mapping of setting key to :class:`Fact` (the value as compared, the value in words, where it was read):
port's from the run directory (:mod:`porting.baseline.port_side`: the resolved recipe in manifest.json and what port's
code does with it), a `port baseline` run's from its recipe and the torch loop, a CUDA job's from what intake reads
(:mod:`porting.intake.effective`: TrainingArguments, trainer_state.json, LLaMA-Factory and DeepSpeed configs, the
tokenizer's and the model's config). A fact whose value is None cannot be known from that side's files; its words say
why and what it would be. :func:`table` makes one :class:`~porting.baseline.comparison.SettingRow` per setting of
:data:`SETTINGS`, in that order, with the expected effect on the curve of each difference (:data:`EFFECTS`).

The field's precision-alignment guides start here: collect the configs both logs print and compare them by hand
(volcengine/verl docs/ascend_tutorial/dev_guide/precision_analysis/precision_alignment_zh.md); many curve gaps are a
setting, not a kernel.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, Mapping

from porting.baseline.comparison import SettingRow


@dataclass(frozen=True)
class Fact:
    """One setting of one side: ``value`` as compared (None: not knowable from that side's files), ``shown`` in
    words, ``source``: the file and key, the library default, or port's code that decides it."""

    value: Any
    shown: str
    source: str

    def to_dict(self) -> dict[str, Any]:
        return {"value": list(self.value) if isinstance(self.value, tuple) else self.value, "shown": self.shown,
                "source": self.source}

    @classmethod
    def from_dict(cls, d: Any, where: str) -> Fact:
        if not isinstance(d, dict) or not isinstance(d.get("shown"), str) or not isinstance(d.get("source"), str):
            raise ValueError(f"{where}: expected an object with 'value', 'shown' and 'source' (strings)")
        v = d.get("value")
        if isinstance(v, list):
            if len(v) > 8 or not all(isinstance(x, (int, float, str)) for x in v):
                raise ValueError(f"{where}.value: expected a short list of numbers or words")
            v = tuple(v)
        elif v is not None and not isinstance(v, (int, float, str, bool)):
            raise ValueError(f"{where}.value: expected a number, a word, true/false or null")
        return cls(v, d["shown"][:400], d["source"][:400])


Side = Mapping[str, Fact]

# (key, label), in the order the table lists them: what most often parts two curves first.
SETTINGS: tuple[tuple[str, str], ...] = (
    ("loss_normalisation", "loss normalisation"), ("weight_decay", "weight decay"),
    ("decay_norms_biases", "weight decay on norms and biases"), ("warmup_unit", "warm-up unit"),
    ("warmup_steps", "warm-up length (optimizer steps)"), ("lr", "peak learning rate"),
    ("lr_schedule", "learning-rate schedule"), ("max_grad_norm", "max_grad_norm (clipping)"),
    ("betas", "Adam betas"), ("eps", "Adam epsilon"), ("global_batch", "global batch (sequences per step)"),
    ("seq_length", "sequence length"), ("padding_side", "padding side"), ("truncation", "truncation"),
    ("neftune", "NEFTune noise alpha"), ("attention_dropout", "attention dropout"),
    ("label_smoothing", "label smoothing"), ("chat_template", "chat template"), ("packing", "packing"),
    ("precision", "precision"), ("seed", "seed"), ("data_order", "data order"), ("determinism", "determinism"),
)

# The expected effect on the loss curve when the two sides differ, by setting.
EFFECTS: dict[str, str] = {
    "loss_normalisation": "a mean of micro-batch means weighs the tokens of short micro-batches more than a per-token "
                          "mean over the global batch: the logged loss and the gradient differ whenever micro-batches "
                          "hold different numbers of target tokens (padding, lengths), a few % on instruction data; "
                          "none with one micro-batch on one device (transformers#34242)",
    "weight_decay": "the side with more decay shrinks every decayed weight by lr x weight_decay more per step: a gap "
                    "that grows with the steps",
    "decay_norms_biases": "norm gains and biases shrink by lr x weight_decay per step on the side that decays them: "
                          "a slow drift that grows with lr x weight_decay x steps (none at weight_decay 0)",
    "warmup_unit": "a warm-up counted in micro-steps ends grad_accum times sooner (in optimizer steps): the early "
                   "losses part, the gap closes after warm-up",
    "warmup_steps": "the learning rate ramps at another pace: the first steps differ most, then the curves meet",
    "lr": "every update is scaled differently: the curves part from the first step and keep apart",
    "lr_schedule": "the rates part after warm-up (another decay shape or floor): the curves part as the rates do",
    "max_grad_norm": "steps whose global gradient norm exceeds the smaller threshold are scaled down on that side "
                     "only: the early steps (largest gradients) differ first; the logged grad norm shows how often "
                     "it binds",
    "betas": "Adam's moment averages differ: update sizes differ from the first steps (beta2 most at the start)",
    "eps": "updates of parameters with small second moments differ; visible with a large eps or bf16 moments",
    "global_batch": "another batch size is another optimisation: not comparable step for step",
    "seq_length": "other sequences are trained (cut or split differently): the per-token loss differs",
    "padding_side": "none in exact arithmetic when the padding is masked out of attention and loss and positions "
                    "are rotary (relative); kernels see the tokens at other offsets, so rounding differs slightly; "
                    "a collator that derives position ids from the mask shifts absolute positions",
    "truncation": "examples longer than the limit keep different tokens (another side cut, or prompt and response "
                  "cut in proportion): the loss is over different targets for those examples",
    "neftune": "uniform noise alpha / sqrt(L x d) on the input embeddings raises that side's training loss: a "
               "systematic offset, larger with alpha (NEFTune, transformers neftune_noise_alpha)",
    "attention_dropout": "dropout on attention probabilities raises that side's training loss and adds step-to-step "
                         "noise",
    "label_smoothing": "the loss includes a smoothing term: that side's loss is higher by construction",
    "chat_template": "other prompt tokens: the loss is over different text from step 1",
    "packing": "packed rows put several examples in one row: the loss per step covers other tokens, and without "
               "per-example attention masks examples attend to each other",
    "precision": "rounding differs: bf16 against fp32 curves agree to about 1-2%, not to fp32's 1e-5",
    "seed": "another seed draws another data order (and dropout, noise): per-step losses differ, the trend agrees",
    "data_order": "each step sees other examples: per-step losses differ by batch composition though the trend "
                  "agrees; compare means over windows (the field's gates do), not single steps",
    "determinism": "no change of the expected curve; without it, two launches of the same side differ in rounding, "
                   "which bounds how closely the two sides can agree",
}


def _same(a: Any, b: Any) -> bool:
    if isinstance(a, bool) or isinstance(b, bool):
        return a is b
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        return math.isclose(float(a), float(b), rel_tol=1e-6, abs_tol=1e-12)
    if isinstance(a, tuple) and isinstance(b, tuple):
        return len(a) == len(b) and all(_same(x, y) for x, y in zip(a, b))
    return a == b


def unknown(why: str, source: str = "not in the files") -> Fact:
    return Fact(None, why, source)


def _row(key: str, label: str, cuda: Fact, port: Fact, equal: bool | None, effect: str) -> SettingRow:
    return SettingRow(setting=label, cuda=cuda.shown, port=port.shown, equal=equal, effect=effect,
                      cuda_source=cuda.source, port_source=port.source)


def _warmup_effect(cuda: Side, port: Side) -> str:
    """A warm-up that is the other side's times the gradient accumulation was counted in micro-steps on one side."""
    c, p = cuda.get("warmup_steps"), port.get("warmup_steps")
    accum = next((f.value for f in (cuda.get("grad_accum"), port.get("grad_accum")) if f and f.value), None)
    if c is None or p is None or not c.value or not p.value or not accum or accum == 1:
        return EFFECTS["warmup_steps"]
    for a, b, side in ((p.value, c.value, "port"), (c.value, p.value, "CUDA")):
        if a == b * accum:
            return (f"the {side} warm-up is the other's x {accum} (the gradient accumulation): one side counted it in "
                    f"micro-steps; its learning rate ramps {accum}x slower, so the early losses part; "
                    + EFFECTS["warmup_unit"])
    return EFFECTS["warmup_steps"]


def _decay_equal(cuda: Side, port: Side) -> bool | None:
    """Decay on norms and biases only matters where weight decay is not 0 on that side."""
    wd_c, wd_p = cuda.get("weight_decay"), port.get("weight_decay")
    c, p = cuda.get("decay_norms_biases"), port.get("decay_norms_biases")
    if wd_c and wd_p and wd_c.value == 0 and wd_p.value == 0:
        return True
    if c is None or p is None or c.value is None or p.value is None:
        return None
    return _same(c.value, p.value)


def table(cuda: Side, port: Side) -> tuple[SettingRow, ...]:
    """One row per setting of :data:`SETTINGS`: both sides' values in words, equal or not (None: one side cannot be
    known), and the expected effect of each difference (empty when equal); none when port's side recorded nothing."""
    if not port:
        return ()
    out = []
    for key, label in SETTINGS:
        c = cuda.get(key) or unknown("not recorded by this side")
        p = port.get(key) or unknown("not recorded by this side")
        if key == "decay_norms_biases":
            equal = _decay_equal(cuda, port)
        else:
            equal = None if c.value is None or p.value is None else _same(c.value, p.value)
        effect = "" if equal else _warmup_effect(cuda, port) if key == "warmup_steps" else EFFECTS[key]
        if key == "chat_template" and equal is False and "none" not in (c.value, p.value):
            out.append(_row(key, label, c, p, None, "cannot be compared by name (each side names its own template): "
                            "render one example on both sides and compare the tokens; if they differ: " + effect))
            continue
        if equal is None:
            effect = "cannot be compared: " + ("the CUDA side's" if c.value is None else "port's") + \
                     " value is not in its files; if they differ: " + effect
        out.append(_row(key, label, c, p, equal, effect))
    return tuple(out)


def differing(rows: tuple[SettingRow, ...]) -> list[SettingRow]:
    """The rows that differ (``equal`` False), in table order."""
    return [r for r in rows if r.equal is False]


def render(rows: tuple[SettingRow, ...], all_rows: bool = False, left: str = "CUDA") -> list[str]:
    """The differing rows (or every row) as text lines, ``left`` naming the other side; a count of the equal and the
    unknown ones in the header."""
    shown = list(rows) if all_rows else differing(rows)
    same = sum(r.equal is True for r in rows)
    unk = [r.setting for r in rows if r.equal is None]
    head = (f"EFFECTIVE SETTINGS ({left} side | port side): {len(differing(rows))} differ, {same} equal, "
            f"{len(unk)} not comparable from the files" + (f" ({', '.join(unk[:6])}{', ...' if len(unk) > 6 else ''})" if unk else ""))
    if rows and len(unk) == len(rows):
        head += f"; the {left} side's settings were not read: make the baseline with `port intake`, or pass --cuda-job DIR"
    lines = [head]
    for r in shown:
        mark = {True: "=", False: "DIFFERS", None: "?"}[r.equal]
        lines.append(f"  {mark:<7} {r.setting}: {left} {r.cuda}  |  port {r.port}")
        if r.effect:
            lines.append(f"          effect: {r.effect}")
    return lines


def side_to_dict(side: Side) -> dict[str, dict[str, Any]]:
    return {k: f.to_dict() for k, f in side.items()}


def side_from_dict(doc: Any, where: str) -> dict[str, Fact]:
    """A side as a baseline document stores it (``imported.effective_settings``); ValueError naming the bad key."""
    if not isinstance(doc, dict) or len(doc) > 64:
        raise ValueError(f"{where}: expected an object of at most 64 settings")
    return {str(k)[:64]: Fact.from_dict(v, f"{where}.{str(k)[:64]}") for k, v in doc.items()}
