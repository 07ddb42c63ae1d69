"""``training_args.bin`` read without unpickling: the pickle opcode stream is interpreted here, by a small
stack machine that builds plain containers and scalars only and never imports or calls anything.

``transformers.Trainer`` saves its arguments with ``torch.save(self.args, "training_args.bin")``: a zip
(``<name>/data.pkl``, torch >= 1.6) or a bare pickle. Its stream names a handful of globals: the
``TrainingArguments`` class (or a known subclass), enums such as ``IntervalStrategy`` (rebuilt by
``REDUCE`` with the enum's value), ``torch.device`` and accelerate's ``PartialState``. Those are
recognised by name and turned into their value (enums, devices) or a dict of their state (the arguments
class, via ``NEWOBJ`` + ``BUILD``); any other global, any other call, persistent ids (tensors) and
extension codes are refused with one line. ``pickletools.genops`` decodes the opcodes (it only parses).
"""

from __future__ import annotations

import io
import pickletools
import zipfile
import zlib
from pathlib import Path
from typing import Any

from model_zoo import files
from porting.intake import IntakeError
from porting.intake.typed import name

MAX_BIN_BYTES = 1 << 20        # a TrainingArguments pickle is ~4 KB
MAX_OPS = 200_000
MAX_ITEMS = 100_000            # values built in all, every memo reference expanded (a TrainingArguments: ~300)
MAX_DEPTH = 32                 # nesting of the value built (a TrainingArguments: 4 levels)

ARGS_CLASSES = {
    ("transformers.training_args", "TrainingArguments"),
    ("transformers.training_args_seq2seq", "Seq2SeqTrainingArguments"),
    ("trl.trainer.sft_config", "SFTConfig"),
    ("llamafactory.hparams.training_args", "TrainingArguments"),
}
ENUMS = {
    ("transformers.trainer_utils", "IntervalStrategy"), ("transformers.trainer_utils", "SchedulerType"),
    ("transformers.trainer_utils", "HubStrategy"), ("transformers.trainer_utils", "SaveStrategy"),
    ("transformers.trainer_utils", "FSDPOption"), ("transformers.training_args", "OptimizerNames"),
    ("transformers.debug_utils", "DebugOption"), ("accelerate.utils.dataclasses", "DistributedType"),
    ("transformers.training_args", "ParallelMode"),
}
OPAQUE = {("accelerate.state", "PartialState"), ("accelerate.state", "AcceleratorState")}
DEVICE = ("torch", "device")


class _Global:
    def __init__(self, module: str, name: str):
        self.module, self.name = module, name


class _Obj(dict):
    """An instance of an allowed class: its pickled state, and the class name under ``__class__``."""


_MARK = object()


def _refuse(where: str, what: str) -> IntakeError:
    return IntakeError(f"{where}: refused: {what}; port reads training_args.bin without running code and accepts "
                       "only TrainingArguments with plain values (export them instead: "
                       "json.dump(trainer.args.to_dict(), ...) and import the JSON)")


def _global(mod: str, name: str, where: str) -> _Global:
    key = (mod, name)
    if key in ARGS_CLASSES or key in ENUMS or key in OPAQUE or key == DEVICE:
        return _Global(mod, name)
    raise _refuse(where, f"the pickle names {mod}.{name}, which is not the TrainingArguments class or one of its "
                         "known enums (loading it would import and may run code)")


def _reduce(fn: Any, args: Any, where: str) -> Any:
    if not isinstance(fn, _Global) or not isinstance(args, tuple):
        raise _refuse(where, "a call (REDUCE) of something that is not a known enum or torch.device")
    key = (fn.module, fn.name)
    if key in ENUMS and len(args) == 1 and isinstance(args[0], (str, int)):
        return args[0]
    if key == DEVICE and args and all(isinstance(a, (str, int)) for a in args):
        return ":".join(str(a) for a in args)
    kinds = ", ".join(type(a).__name__ for a in args[:4])   # never repr(args): a memo bomb expands when printed
    raise _refuse(where, f"a call of {fn.module}.{fn.name}({kinds}) (only enums and torch.device are rebuilt)")


def _pop_mark(stack: list) -> list:
    for i in range(len(stack) - 1, -1, -1):
        if stack[i] is _MARK:
            items = stack[i + 1:]
            del stack[i:]
            return items
    raise ValueError("no MARK")


SIMPLE = {"NONE": lambda a: None, "NEWTRUE": lambda a: True, "NEWFALSE": lambda a: False,
          "EMPTY_DICT": lambda a: {}, "EMPTY_LIST": lambda a: [], "EMPTY_TUPLE": lambda a: (), "EMPTY_SET": lambda a: []}
LITERALS = {"INT", "BININT", "BININT1", "BININT2", "LONG", "LONG1", "LONG4", "BINFLOAT", "FLOAT", "BINUNICODE",
            "SHORT_BINUNICODE", "BINUNICODE8", "UNICODE", "STRING", "BINSTRING", "SHORT_BINSTRING", "BINBYTES",
            "SHORT_BINBYTES", "BINBYTES8"}


class _Tuple(tuple):
    """A tuple that knows its nesting depth: a tuple is hashed and compared recursively in C (a dict key, a
    SETITEM), so a 190,000-deep one would overflow the C stack (signal 11) before any Python bound ran."""

    depth: int


def _tuple(items: list, where: str) -> tuple:
    t = _Tuple(items)
    t.depth = 1 + max((x.depth for x in items if isinstance(x, _Tuple)), default=0)
    if t.depth > MAX_DEPTH:
        raise _refuse(where, f"tuples nested deeper than {MAX_DEPTH} levels")
    return t


def _step(name: str, arg: Any, stack: list, memo: dict, where: str) -> None:
    """One opcode; raises for anything outside the accepted subset."""
    if name in SIMPLE:
        stack.append(SIMPLE[name](arg))
    elif name in LITERALS:
        if isinstance(arg, int) and abs(arg) > 1 << 64:
            raise _refuse(where, "an integer wider than 64 bits")
        stack.append(arg)
    elif name in ("PROTO", "FRAME"):
        pass
    elif name == "MARK":
        stack.append(_MARK)
    elif name in ("BINPUT", "LONG_BINPUT", "PUT"):
        memo[arg] = stack[-1]
    elif name == "MEMOIZE":
        memo[len(memo)] = stack[-1]
    elif name in ("BINGET", "LONG_BINGET", "GET"):
        stack.append(memo[arg])
    elif name == "GLOBAL":
        mod, _, attr = arg.partition(" ")
        stack.append(_global(mod, attr, where))
    elif name == "STACK_GLOBAL":
        attr, mod = stack.pop(), stack.pop()
        if not (isinstance(mod, str) and isinstance(attr, str)):
            raise _refuse(where, "STACK_GLOBAL with non-string names")
        stack.append(_global(mod, attr, where))
    elif name in ("TUPLE", "LIST", "FROZENSET"):
        items = _pop_mark(stack)
        stack.append(_tuple(items, where) if name == "TUPLE" else list(items))
    elif name in ("TUPLE1", "TUPLE2", "TUPLE3"):
        n = int(name[-1])
        items = stack[-n:]
        del stack[-n:]
        stack.append(_tuple(items, where))
    elif name == "DICT":
        items = _pop_mark(stack)
        stack.append(dict(zip(items[::2], items[1::2])))
    elif name in ("APPEND", "APPENDS", "ADDITEMS"):
        items = [stack.pop()] if name == "APPEND" else _pop_mark(stack)
        stack[-1].extend(items)
    elif name in ("SETITEM", "SETITEMS"):
        items = stack[-2:] if name == "SETITEM" else _pop_mark(stack)
        if name == "SETITEM":
            del stack[-2:]
        target = stack[-1]
        if not isinstance(target, dict):
            raise _refuse(where, "SETITEM on something that is not a dict")
        for k, v in zip(items[::2], items[1::2]):
            if not isinstance(k, (str, int, float, bool, type(None), tuple)):
                raise _refuse(where, f"a dict key of type {type(k).__name__}")
            target[k] = v
    elif name == "NEWOBJ":
        args, cls = stack.pop(), stack.pop()
        if not isinstance(cls, _Global) or (cls.module, cls.name) not in ARGS_CLASSES | OPAQUE or args != ():
            raise _refuse(where, "NEWOBJ of something that is not the TrainingArguments class")
        stack.append(_Obj(__class__=f"{cls.module}.{cls.name}"))
    elif name == "REDUCE":
        args, fn = stack.pop(), stack.pop()
        stack.append(_reduce(fn, args, where))
    elif name == "BUILD":
        state = stack.pop()
        obj = stack[-1]
        if isinstance(state, tuple) and len(state) == 2:   # (dict state, slot state)
            state = {**(state[0] or {}), **(state[1] or {})}
        if not isinstance(obj, _Obj) or not isinstance(state, dict):
            raise _refuse(where, "BUILD of something that is not the TrainingArguments class")
        obj.update({k: v for k, v in state.items() if isinstance(k, str) and k != "__class__"})
    elif name == "STOP":
        raise StopIteration
    else:
        raise _refuse(where, f"pickle opcode {name} (persistent ids, extensions and old-style instances are not read)")


def interpret(data: bytes, where: str) -> Any:
    """The value of one pickle stream, built from the accepted subset only."""
    stack: list = []
    memo: dict = {}
    try:
        for n, (op, arg, _pos) in enumerate(pickletools.genops(io.BytesIO(data))):
            if n > MAX_OPS or len(stack) > MAX_ITEMS or len(memo) > MAX_ITEMS:
                raise _refuse(where, f"more than {MAX_OPS:,} pickle operations or {MAX_ITEMS:,} values")
            _step(op.name, arg, stack, memo, where)
    except StopIteration:
        if len(stack) != 1:
            raise _refuse(where, "a pickle that does not end with one value") from None
        _check_built(stack[0], where)
        return stack[0]
    except IntakeError:
        raise
    except (ValueError, KeyError, IndexError, TypeError, AttributeError) as e:
        raise IntakeError(f"{where}: not a readable pickle ({type(e).__name__}: {str(e)[:80]}); expected the "
                          "training_args.bin that transformers.Trainer saves") from None
    raise IntakeError(f"{where}: the pickle ends without STOP; the file is cut or not a pickle")


def _check_built(value: Any, where: str) -> None:
    """Refuse a value that contains itself, nests deeper than MAX_DEPTH, or holds more than MAX_ITEMS
    values once every memo reference is expanded: a 411-byte pickle whose memo entries refer to each other
    nine levels deep (a "billion laughs") is 9^9 values when copied or printed. The walk is iterative and
    visits each container once (sizes memoised by identity), so it costs the pickle's own size."""
    size: dict[int, int] = {}
    depth: dict[int, int] = {}
    stack: list[tuple[Any, bool]] = [(value, False)]
    open_: set[int] = set()
    while stack:
        v, done = stack.pop()
        kids = list(v.keys()) + list(v.values()) if isinstance(v, dict) else v if isinstance(v, (list, tuple)) else None
        if kids is None:
            continue
        if done:
            open_.discard(id(v))
            size[id(v)] = min(MAX_ITEMS + 1, 1 + sum(size.get(id(k), 1) for k in kids))
            depth[id(v)] = 1 + max((depth.get(id(k), 0) for k in kids), default=0)
            if size[id(v)] > MAX_ITEMS or depth[id(v)] > MAX_DEPTH:
                raise _refuse(where, f"memo references that expand to more than {MAX_ITEMS:,} values or nest deeper "
                                     f"than {MAX_DEPTH} levels (a 'billion laughs' pickle)")
            continue
        if id(v) in open_:
            raise _refuse(where, "a value that contains itself (memo references in a cycle)")
        if id(v) in size:
            continue
        open_.add(id(v))
        stack.append((v, True))
        stack.extend((k, False) for k in kids)


def read_training_args_bin(path: str | Path) -> dict[str, Any]:
    """The TrainingArguments fields saved in ``path`` (a torch zip or a bare pickle), as a plain dict."""
    p = Path(path)
    size = p.stat().st_size if p.is_file() else -1
    if size < 0:
        raise IntakeError(f"{p}: training_args.bin not found or not a regular file; check the path")
    if size > MAX_BIN_BYTES:
        raise IntakeError(f"{p}: {size:,} bytes, more than the {MAX_BIN_BYTES:,} a training_args.bin has; not one port reads")
    raw = files._read_at_most(p, MAX_BIN_BYTES) or b""
    data, where = raw, name(p)
    if raw[:4] == b"PK\x03\x04":
        data, where = _zip_member(raw, name(p))
    value = interpret(data, where)
    if not isinstance(value, _Obj) or value.get("__class__", "").rsplit(".", 1)[-1] not in {c for _, c in ARGS_CLASSES}:
        raise IntakeError(f"{where}: holds {type(value).__name__}, not TrainingArguments; expected the "
                          "training_args.bin that transformers.Trainer saves")
    # private fields stay out (accelerate state), except _n_gpu: the GPUs of one process
    return {k: _plain(v) for k, v in value.items() if not k.startswith("_") or k in ("__class__", "_n_gpu")}


def _zip_member(raw: bytes, where: str) -> tuple[bytes, str]:
    """The one ``*/data.pkl`` of torch.save's zip; an encrypted member, a compression method zipfile does
    not have, or a broken archive is one line (torch.save stores members uncompressed, never encrypted)."""
    try:
        with zipfile.ZipFile(io.BytesIO(raw)) as z:
            names = [i for i in z.infolist() if i.filename.endswith("/data.pkl") or i.filename == "data.pkl"]
            if len(names) != 1 or names[0].file_size > MAX_BIN_BYTES:
                raise IntakeError(f"{where}: a zip without one small data.pkl; expected torch.save's format")
            member = f"{where}:{name(names[0].filename)}"
            if names[0].flag_bits & 0x1:
                raise IntakeError(f"{member}: an encrypted zip member; torch.save never encrypts: copy "
                                  "training_args.bin again from the run's output_dir")
            return z.read(names[0]), member
    except (zipfile.BadZipFile, NotImplementedError, RuntimeError, EOFError, OSError, zlib.error) as e:
        raise IntakeError(f"{where}: a zip port cannot read ({type(e).__name__}: {name(str(e))[:80]}); "
                          "expected torch.save's format (members stored, not encrypted): copy training_args.bin "
                          "again") from None


def _plain(v: Any, depth: int = 0) -> Any:
    if depth > 8:
        return "<nested>"
    if isinstance(v, _Obj):
        return f"<{v.get('__class__')}>"
    if isinstance(v, dict):
        return {str(k): _plain(x, depth + 1) for k, x in v.items()}
    if isinstance(v, (list, tuple)):
        return [_plain(x, depth + 1) for x in v]
    if isinstance(v, bytes):
        return v.decode("utf-8", "replace")
    return v
