"""`port ops scan` / `port ops zoo`: operator coverage of a model on Ascend.

scan: run the PyTorch model (HF transformers on CPU, or on meta tensors for big configs) forward,
backward and one optimizer step under a TorchDispatchMode that records every aten overload with its
shapes, dtypes and phase; classify each against the real torch_npu registry
(porting/data/op_plugin_functions.yaml, from Ascend/op-plugin, BSD-3-Clause) for the installed
torch version; for missing or fused ops, give the Ascend replacement path (the MindSpore fused kernel
the zoo uses, the torch_npu/MindSpeed fused op, or the composition of standard ops).

zoo: the MindSpore side: which kernel (fused Ascend op or reference composition) each layer of a
zoo model gets on a target device, from ``model_zoo.kernels.select_kernels``.
"""

from __future__ import annotations

import dataclasses
import importlib
from functools import lru_cache
from pathlib import Path
from typing import Any, Callable

from porting.diagnostics import DATA_DIR, DiagnosticsError, load_yaml

REGISTRY_FILE = "op_plugin_functions.yaml"
IMPL_KEYS = ("op_api", "acl_op", "internal_format_opapi")
PHASES = ("forward", "backward", "optimizer")


# ---------------------------------------------------------------------------------------------
# The torch_npu registry.

@dataclasses.dataclass(frozen=True)
class RegEntry:
    name: str                           # "add.Tensor" (overload "default" is the bare name)
    section: str                        # official | autograd | custom | symint | quant
    impls: dict[str, frozenset[str]]    # op_api / acl_op -> torch versions ("v2.13")


def _expand(spec: Any, order: list[str]) -> frozenset[str]:
    """'all_version' | [vA, vB|newest] (inclusive range) | 'vA, vB' | 'vA' -> set of versions."""
    if spec == "all_version":
        return frozenset(order)
    if isinstance(spec, list) and len(spec) == 2:
        lo = order.index(spec[0]) if spec[0] in order else 0
        hi = len(order) - 1 if spec[1] == "newest" or spec[1] not in order else order.index(spec[1])
        return frozenset(order[lo:hi + 1])
    if isinstance(spec, list):
        return frozenset(str(x) for x in spec)
    if isinstance(spec, str):
        return frozenset(x.strip() for x in spec.split(",") if x.strip())
    return frozenset()


@lru_cache(maxsize=1)
def load_registry() -> tuple[dict[str, RegEntry], tuple[str, ...]]:
    import yaml

    path = DATA_DIR / REGISTRY_FILE
    with open(path, encoding="utf-8") as f:
        data = yaml.load(f, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))
    order = [str(v) for v in data["all_version"]]
    entries: dict[str, RegEntry] = {}
    for section in ("official", "autograd", "custom", "symint", "quant"):
        for item in data.get(section) or []:
            func = str(item.get("func", ""))
            name = func.split("(", 1)[0].strip()
            if not name:
                continue
            impls = {k: _expand(item[k], order) for k in IMPL_KEYS if k in item}
            if not impls:  # listed without a version tag: present in every version
                impls = {"op_api": frozenset(order)}
            prev = entries.get(name)
            if prev is not None:  # the same overload in two sections: union of versions
                merged = dict(prev.impls)
                for k, v in impls.items():
                    merged[k] = merged.get(k, frozenset()) | v
                impls = merged
            entries[name] = RegEntry(name, prev.section if prev else section, impls)
    return entries, tuple(order)


def registry_versions() -> list[str]:
    return list(load_registry()[1])


def torch_tag(version: str) -> str:
    parts = version.split("+")[0].split(".")
    return f"v{parts[0]}.{parts[1]}" if len(parts) >= 2 else f"v{version}"


@lru_cache(maxsize=1)
def rules() -> dict:
    return load_yaml("op_rules.yaml")


# ---------------------------------------------------------------------------------------------
# Recording.

@dataclasses.dataclass
class OpRecord:
    op: str                      # "aten::add.Tensor"
    name: str                    # registry key "add.Tensor"
    count: int = 0
    phases: set[str] = dataclasses.field(default_factory=set)
    dtypes: set[str] = dataclasses.field(default_factory=set)
    examples: list[str] = dataclasses.field(default_factory=list)
    is_view: bool = False


def _tensor_sig(x: Any) -> str | None:
    import torch

    if isinstance(x, torch.Tensor):
        return f"{x.dtype}".replace("torch.", "") + str(list(x.shape))
    return None


def make_recorder():
    """A TorchDispatchMode that records every aten overload; ``.phase`` is set by the caller."""
    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_flatten

    class Recorder(TorchDispatchMode):
        def __init__(self) -> None:
            super().__init__()
            self.phase = "forward"
            self.ops: dict[str, OpRecord] = {}

        def __torch_dispatch__(self, func, types, args=(), kwargs=None):
            kwargs = kwargs or {}
            out = func(*args, **kwargs)
            schema = func._schema.name  # "aten::add"
            ns, base = schema.split("::", 1) if "::" in schema else ("aten", schema)
            overload = func._overloadname
            name = base if overload == "default" else f"{base}.{overload}"
            key = f"{ns}::{name}"
            rec = self.ops.get(key)
            if rec is None:
                rec = self.ops[key] = OpRecord(op=key, name=name, is_view=bool(getattr(func, "is_view", False)))
            rec.count += 1
            rec.phases.add(self.phase)
            flat, _ = tree_flatten((args, kwargs))
            sigs = [s for s in (_tensor_sig(a) for a in flat) if s]
            for a in flat:
                if isinstance(a, torch.Tensor):
                    rec.dtypes.add(str(a.dtype))
            sig = ", ".join(sigs[:4]) + (" ..." if len(sigs) > 4 else "")
            if len(rec.examples) < 3 and sig not in rec.examples:
                rec.examples.append(sig)
            return out

    return Recorder()


def run_model(model, inputs: dict, *, optimizer_step: bool = True) -> dict[str, OpRecord]:
    """Forward, backward and (optionally) one AdamW step under the recorder."""
    import torch

    rec = make_recorder()
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-4) if optimizer_step and params else None
    with rec:
        rec.phase = "forward"
        out = model(**inputs)
        loss = _loss_of(out)
        rec.phase = "backward"
        loss.backward()
        if opt is not None and all(p.device.type != "meta" for p in params):
            rec.phase = "optimizer"
            opt.step()
    return rec.ops


def _loss_of(out: Any):
    import torch

    loss = getattr(out, "loss", None)
    if loss is None and isinstance(out, dict):
        loss = out.get("loss")
    if loss is None:
        t = out[0] if isinstance(out, (tuple, list)) else out
        if not isinstance(t, torch.Tensor):
            raise DiagnosticsError("the model returned no loss and no tensor; return a loss or logits")
        loss = t.float().sum()
    return loss


# ---------------------------------------------------------------------------------------------
# Model sources.

def load_hf(src: str, *, meta: bool = False, attn: str = "sdpa", batch: int = 2, seq: int = 16):
    """An HF causal LM (real weights from a directory, or random on meta from its config)."""
    import torch
    import transformers

    from porting.model_paths import resolve_hf

    try:
        path = resolve_hf(src)
    except Exception as e:  # UnknownModelError: fall back to the zoo preset's config on meta
        from model_zoo import presets

        if str(src) in presets.names():
            cfg_dict = presets.config(str(src)).to_hf()
            path, meta = None, True
        else:
            raise e
    else:
        cfg_file = Path(path) / "config.json"
        if not cfg_file.is_file():
            raise DiagnosticsError(f"{path}: no config.json; expected an HF model directory")
        import json

        try:
            cfg_dict = json.loads(cfg_file.read_text())
        except json.JSONDecodeError as e:
            raise DiagnosticsError(f"{cfg_file}: invalid JSON ({e.msg} at line {e.lineno})") from None
    try:
        config = transformers.AutoConfig.for_model(**cfg_dict) if "model_type" in cfg_dict else None
    except (ValueError, KeyError, TypeError) as e:
        raise DiagnosticsError(f"{src}: config not understood by transformers: {e}") from None
    if config is None:
        raise DiagnosticsError(f"{src}: config.json has no model_type; expected an HF causal LM config")
    config._attn_implementation = attn
    has_weights = path is not None and any(Path(path).glob("*.safetensors")) or (
        path is not None and any(Path(path).glob("pytorch_model*.bin")))
    if meta or not has_weights:
        with torch.device("meta"):
            model = transformers.AutoModelForCausalLM.from_config(config, attn_implementation=attn)
        device = "meta"
    else:
        try:
            model = transformers.AutoModelForCausalLM.from_pretrained(path, torch_dtype=torch.float32,
                                                                      attn_implementation=attn)
        except (OSError, ValueError) as e:
            raise DiagnosticsError(f"{path}: transformers could not load the model: {str(e).splitlines()[0]}") from None
        device = "cpu"
    model.train()
    vocab = int(getattr(config, "vocab_size", 32000))
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, vocab, (batch, seq), generator=g).to(device)
    return model, {"input_ids": ids, "labels": ids.clone()}, device


def load_entry_point(spec: str):
    """'package.module:factory' -> factory() returning (model, inputs dict)."""
    mod_name, _, fn_name = spec.partition(":")
    if not mod_name or not fn_name:
        raise DiagnosticsError(f"--module {spec!r}: expected package.module:factory")
    try:
        mod = importlib.import_module(mod_name)
    except ImportError as e:
        raise DiagnosticsError(f"--module {spec!r}: cannot import {mod_name} ({e})") from None
    fn: Callable | None = getattr(mod, fn_name, None)
    if not callable(fn):
        raise DiagnosticsError(f"--module {spec!r}: {mod_name} has no callable {fn_name}")
    made = fn()
    if not (isinstance(made, tuple) and len(made) == 2 and isinstance(made[1], dict)):
        raise DiagnosticsError(f"--module {spec!r}: the factory must return (model, inputs_dict)")
    return made[0], made[1], "cpu"


# ---------------------------------------------------------------------------------------------
# Classification.

def _zoo_replacement(kernel: str) -> dict:
    from model_zoo import kernels

    return {"mindspore": kernels.FUSED_OPS[kernel] + " (model_zoo kernel '" + kernel + "', Ascend)",
            "composition": kernels.REFERENCE_OPS[kernel] + " (model_zoo reference path)"}


def replacement_for(name: str) -> dict | None:
    base = name.split(".", 1)[0]
    r = rules()["replacements"].get(base)
    if r is None:
        return None
    out = {"torch_npu": r.get("torch_npu")}
    if r.get("zoo_kernel"):
        out.update(_zoo_replacement(r["zoo_kernel"]))
    return out


def _has_composite(op: str) -> bool:
    import torch

    try:
        return bool(torch._C._dispatch_has_kernel_for_dispatch_key(op, "CompositeExplicitAutograd")
                    or torch._C._dispatch_has_kernel_for_dispatch_key(op, "CompositeImplicitAutograd"))
    except RuntimeError:
        return False


def classify(rec: OpRecord, version: str) -> dict:
    """status: one of STATUS_ORDER (missing and not_for_version block a run on NPU)."""
    reg, _order = load_registry()
    base = rec.name.split(".", 1)[0]
    row: dict[str, Any] = {"op": rec.op, "count": rec.count, "phases": [p for p in PHASES if p in rec.phases],
                           "dtypes": sorted(rec.dtypes), "examples": rec.examples, "status": "", "detail": "",
                           "replacement": None}
    limits = [msg for dt, msg in rules()["limited_dtypes"].items() if dt in rec.dtypes]
    parent = rules()["device_specific"].get(base)
    if parent:
        pe = reg.get(parent)
        row["status"] = "device_specific"
        row["detail"] = (f"CPU-only overload; on NPU `{parent}` is dispatched instead "
                         + (f"(torch_npu registers it: {', '.join(sorted(k for k, v in pe.impls.items() if version in v))})"
                            if pe and any(version in v for v in pe.impls.values()) else "(not registered either)"))
        row["replacement"] = replacement_for(base)
        return row
    ns = rec.op.split("::", 1)[0]
    if ns in rules()["bookkeeping_namespaces"]:
        row["status"] = "bookkeeping"
        row["detail"] = f"{ns} range marker, not a compute op"
        return row
    if rec.name in rules()["core_ops"]:
        row["status"] = "core"
        row["detail"] = "implemented in torch_npu's core (host read / copy / storage), not an op-plugin kernel"
        return row
    entry = reg.get(rec.name)
    if entry is not None:
        impls = sorted(k for k, v in entry.impls.items() if version in v)
        if not impls:
            have = sorted(set().union(*entry.impls.values()))
            row["status"] = "not_for_version"
            row["detail"] = (f"registered for torch {have[0]}..{have[-1]} but not for the installed {version}")
            row["replacement"] = replacement_for(rec.name)
        elif impls == ["acl_op"] or limits:
            row["status"] = "limited"
            why = []
            if impls == ["acl_op"]:
                why.append("acl_op only (the older graph-compiled path, no aclnn op_api kernel)")
            why += limits
            row["detail"] = "; ".join(why)
        else:
            row["status"] = "registered"
            row["detail"] = ", ".join(impls)
        rep = replacement_for(rec.name)
        if rep and row["status"] == "registered":
            row["status"] = "fused"
            row["detail"] += "; a fused kernel exists on Ascend"
            row["replacement"] = rep
        return row
    if rec.is_view:
        row["status"] = "view"
        row["detail"] = "view/metadata op: handled by torch_npu's core, no compute kernel needed"
        return row
    rep = replacement_for(rec.name)
    if rep:
        row["status"] = "missing"
        row["detail"] = "no NPU kernel for this overload; use the fused Ascend kernel or the composition"
        row["replacement"] = rep
        return row
    if _has_composite(rec.op):
        row["status"] = "composite"
        row["detail"] = "not registered, but torch decomposes it into other ops (CompositeExplicitAutograd)"
        return row
    row["status"] = "missing"
    row["detail"] = ("not in the torch_npu registry and no composite decomposition: it falls back to the "
                     "CPU or fails on NPU; rewrite it as a composition of registered ops")
    row["replacement"] = {"composition": "rewrite with registered ops (see the registered ops of this scan)"}
    return row


STATUS_ORDER = ("missing", "not_for_version", "limited", "fused", "device_specific", "composite", "core", "view",
                "bookkeeping", "registered")


def scan(model, inputs: dict, *, source: str, device: str, torch_version: str | None = None,
         optimizer_step: bool = True) -> dict:
    import torch

    version = torch_tag(torch_version or torch.__version__)
    known = registry_versions()
    ops = run_model(model, inputs, optimizer_step=optimizer_step and device != "meta")
    rows = [classify(r, version) for r in ops.values()]
    rows.sort(key=lambda r: (STATUS_ORDER.index(r["status"]), r["op"]))
    counts = {s: sum(1 for r in rows if r["status"] == s) for s in STATUS_ORDER}
    return {"format": "port-ops-scan", "source": source, "device": device, "torch": torch.__version__,
            "registry_version": version,
            "registry_knows_version": version in known, "registry_versions": known,
            "phases_run": [p for p in PHASES if any(p in r["phases"] for r in rows)],
            "ops": rows, "counts": counts,
            "blocking": [r["op"] for r in rows if r["status"] in ("missing", "not_for_version")]}


def render_scan(d: dict) -> str:
    out = [f"port ops scan {d['source']} ({d['device']} tensors, torch {d['torch']}; registry {d['registry_version']}"
           + ("" if d["registry_knows_version"] else f" NOT among torch_npu's {d['registry_versions'][0]}.."
              f"{d['registry_versions'][-1]}") + f"; phases {', '.join(d['phases_run'])})", ""]
    out.append(f"{'status':<16} {'op':<58} {'calls':>5}  {'phases':<26} detail")
    for r in d["ops"]:
        out.append(f"{r['status']:<16} {r['op']:<58} {r['count']:>5}  {','.join(r['phases']):<26} {r['detail']}")
        if r["replacement"]:
            for k, v in r["replacement"].items():
                if v:
                    out.append(f"{'':<16}   -> {k}: {v}")
    out += ["", "summary: " + ", ".join(f"{k} {v}" for k, v in d["counts"].items() if v)]
    out.append("blocking on NPU: " + (", ".join(d["blocking"]) if d["blocking"] else "none"))
    return "\n".join(out)


# ---------------------------------------------------------------------------------------------
# MindSpore side: which kernel each layer of a zoo model gets.

def zoo_report(src: str, *, device: str, compute_dtype: str = "bfloat16",
               override: dict[str, str] | None = None) -> dict:
    from model_zoo import presets
    from model_zoo.config import LlamaConfig
    from model_zoo.kernels import select_kernels

    from porting.model_paths import resolve_hf

    if device not in ("Ascend", "CPU", "GPU"):
        raise DiagnosticsError(f"--device {device!r}: expected Ascend, CPU or GPU")
    if str(src) in presets.names():
        cfg = presets.config(str(src))
    else:
        path = resolve_hf(src)
        cfg = LlamaConfig.from_hf(path)
    plan = select_kernels(cfg, device=device, compute_dtype=compute_dtype, override=override)
    rows = plan.rows(cfg.num_hidden_layers)   # each with its MindSpeed-LLM flag and CANN op
    return {"source": str(src), "device": device, "compute_dtype": compute_dtype,
            "layers": cfg.num_hidden_layers, "plan": plan.as_dict(), "rows": rows}


def render_zoo(d: dict, compact: bool = True) -> str:
    out = [f"port ops zoo {d['source']} on {d['device']} ({d['compute_dtype']}, {d['layers']} layers)", ""]
    out.append(f"{'layers':<10} {'kernel':<10} {'impl':<10} {'mindspeed-llm flag':<27} {'op':<70} reason")
    rows = d["rows"]
    if compact:  # the plan is the same for every decoder layer: show it once
        n = d["layers"]
        seen = []
        for r in rows:
            key = (r["kernel"], r["impl"], r["op"], r["reason"], r["layer"] == "final")
            if key in seen:
                continue
            seen.append(key)
            where = "final" if r["layer"] == "final" else f"0-{n - 1}"
            out.append(f"{where:<10} {r['kernel']:<10} {r['impl']:<10} {r['mindspeed_flag']:<27} {r['op']:<70} "
                       f"{r['reason']}")
    else:
        for r in rows:
            out.append(f"{str(r['layer']):<10} {r['kernel']:<10} {r['impl']:<10} {r['mindspeed_flag']:<27} "
                       f"{r['op']:<70} {r['reason']}")
    out.append("")
    out.append(d["plan"]["mindspeed"])
    return "\n".join(out)
