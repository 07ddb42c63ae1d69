"""The chat-template worker: a separate process that renders one Jinja chat template, within limits.

Why a process and not only a sandbox. Jinja's ``ImmutableSandboxedEnvironment`` (what HF transformers
renders with) stops code from escaping but not from spending: ``range`` loops nest, ``'x' * 10**10``,
``9 ** (9 ** 9)``, ``lipsum(n=10**6)``, ``tojson(indent=10**8)``, ``s.center(10**10)`` or a recursive
macro run in C or in plain bytecode where no sandbox hook sees them. So the template is rendered here,
in a child of ``port`` that (1) caps its own address space (``RLIMIT_AS``: an allocation past it is a
``MemoryError``, not a machine that swaps), (2) is killed by the parent past a deadline per request
(:mod:`porting.train.data.template_process`), and (3) dies with its parent (``PR_SET_PDEATHSIG``, and
EOF on stdin). Inside, the environment also refuses the known bombs before they run (operator, call
and step hooks below) so that they get a precise message, and the output is streamed and capped.

Rendering is HF's: the same environment options, filters and globals as transformers'
``_cached_compile_jinja_template`` (huggingface/transformers, src/transformers/utils/chat_template_utils.py)
and the same variables as ``apply_chat_template`` (``messages``, ``tools``, ``documents``,
``add_generation_prompt`` and the tokenizer's special tokens). This file imports only the standard
library and jinja2 and is run by path with ``python -I``: nothing of ``port`` or ``transformers`` loads.

Protocol: one JSON object per line each way. ``{"op": "init", "template", "variables"}``, then per
conversation ``{"op": "row", "messages", "train", "limit"}`` (the whole conversation rendered, kept for
the next requests, and the learned character ranges of the listed trained turns that start before
character ``limit``), then, when more turns are needed, ``{"op": "spans", "train", "limit"}``. Every answer is ``{"ok": ...}`` or ``{"error", "kind"}``.
"""

from __future__ import annotations

import ctypes
import json
import resource
import signal
import sys
from datetime import datetime

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment, safe_range

MEMORY_BYTES = 2 << 30      # the worker's whole address space (a fresh Python with jinja2 maps ~40 MB)
MAX_OUTPUT = 64 << 20       # characters one render may produce (the rows it renders are <= 16 M characters)
MAX_STEPS = 1_000_000       # calls and range iterations in one render (a real template makes ~10 per message)
MAX_POW_BITS = 1 << 16      # an integer result of ** or * may have this many bits
MAX_INDENT = 64             # tojson / indent widths
MAX_LIPSUM = 100            # lipsum paragraphs


class Limit(Exception):
    """The template asked for more than a chat template needs."""


class _Env(ImmutableSandboxedEnvironment):
    """HF's sandbox with the arithmetic and calls of one render counted and bounded."""

    # Only the operators that turn a small expression into a huge value in one C call. Hooking "+" too (for
    # doubling concatenations) made every render ~2x slower (70 against 30 us for Llama 3's template); a
    # doubling loop is stopped by the memory limit, the output cap or the deadline instead.
    intercepted_binops = frozenset(["*", "**"])
    steps = 0

    def step(self) -> None:
        self.steps += 1
        if self.steps > MAX_STEPS:
            raise Limit(f"more than {MAX_STEPS:,} calls or loop steps in one rendering (a loop without bound?)")

    def call(__self, __context, __obj, *args, **kwargs):  # noqa: N805 (jinja's own signature)
        __self.step()
        return super().call(__context, __obj, *args, **kwargs)

    def call_binop(self, context, operator, left, right):
        self.step()
        if operator == "**" and _is_int(left) and _is_int(right) and abs(left) > 1:
            if right > MAX_POW_BITS or right * abs(left).bit_length() > MAX_POW_BITS:
                raise Limit(f"{left} ** {right} is a number of more than {MAX_POW_BITS:,} bits")
        if operator == "*":
            seq, n = (left, right) if _is_int(right) else (right, left)
            if isinstance(seq, (str, list, tuple)) and _is_int(n) and len(seq) * max(n, 0) > MAX_OUTPUT:
                raise Limit(f"a {type(seq).__name__} of {len(seq):,} repeated {n:,} times is more than the "
                            f"{MAX_OUTPUT:,} items a rendering may hold")
            if _is_int(left) and _is_int(right) and left.bit_length() + right.bit_length() > MAX_POW_BITS:
                raise Limit(f"a product of more than {MAX_POW_BITS:,} bits")
        return super().call_binop(context, operator, left, right)


class _Range:
    """``range(...)`` whose iteration counts as steps of the render (nested loops stop at MAX_STEPS), still
    a sequence (``|length``, ``|reverse``, indexing) as the sandbox's range is."""

    def __init__(self, r: range, env: _Env):
        self.r, self.env = r, env

    def __iter__(self):
        for i in self.r:
            self.env.step()
            yield i

    def __len__(self) -> int:
        return len(self.r)

    def __getitem__(self, k):
        return self.r[k]


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def _width(value, what: str):
    """An indent or width argument, refused past :data:`MAX_INDENT`."""
    if _is_int(value) and value > MAX_INDENT or isinstance(value, str) and len(value) > MAX_INDENT:
        raise Limit(f"{what} {value if _is_int(value) else len(value)} is wider than {MAX_INDENT}")
    return value


class _TemplateDict:
    """transformers' ``dict`` global: a callable without the attributes of the ``dict`` type."""

    def __call__(self, *args, **kwargs):
        return dict(*args, **kwargs)

    def fromkeys(self, *args, **kwargs):
        return dict.fromkeys(*args, **kwargs)


class _Namespace(jinja2.utils.Namespace):
    """transformers' ``namespace``: no underscore-prefixed attributes (CPython internals)."""

    def __init__(*args, **kwargs):
        self, attrs = args[0], dict(*args[1:], **kwargs)
        for name in attrs:
            _Namespace._check(name)
        jinja2.utils.Namespace.__init__(self, attrs)

    def __setitem__(self, name, value):
        _Namespace._check(name)
        jinja2.utils.Namespace.__setitem__(self, name, value)

    @staticmethod
    def _check(name):
        if isinstance(name, str) and name.startswith("_"):
            raise jinja2.exceptions.SecurityError(f"a namespace attribute may not start with '_' ({name!r})")


def compile_template(source: str) -> jinja2.Template:
    """The template compiled as transformers compiles it (its filters and globals), with bounds added."""
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        _width(indent, "tojson indent")
        if separators is not None and sum(len(str(s)) for s in separators) > MAX_INDENT:
            raise Limit("tojson separators longer than 64 characters")
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators, sort_keys=sort_keys)

    def strftime_now(fmt):
        return datetime.now().strftime(fmt)

    env = _Env(trim_blocks=True, lstrip_blocks=True, extensions=[jinja2.ext.loopcontrols])
    lipsum, indent, center = env.globals["lipsum"], env.filters["indent"], env.filters["center"]
    wordwrap = env.filters["wordwrap"]

    def bounded_range(*args):
        return _Range(safe_range(*args), env)   # the sandbox's own range: at most 100,000 items

    def bounded_lipsum(n=5, html=True, min=20, max=100):
        if not all(_is_int(v) and 0 <= v <= MAX_LIPSUM for v in (n, min, max)):
            raise Limit(f"lipsum asks for more than {MAX_LIPSUM} paragraphs or words")
        return lipsum(n, html, min, max)

    env.filters.update(tojson=tojson, indent=lambda s, width=4, *a, **k: indent(s, _width(width, "indent"), *a, **k),
                       center=lambda s, width=80: center(s, _width(width, "center width") if _is_int(width) else width),
                       wordwrap=lambda s, width=79, *a, **k: wordwrap(s, _width(width, "wordwrap width"), *a, **k))
    env.globals.update(raise_exception=raise_exception, strftime_now=strftime_now, range=bounded_range,
                       lipsum=bounded_lipsum, dict=_TemplateDict(), namespace=_Namespace)
    return env.from_string(source)


class Worker:
    """One template and the conversation being masked."""

    def __init__(self, source: str, variables: dict):
        self.template = compile_template(source)
        self.env: _Env = self.template.environment
        self.variables = variables
        self.messages: list = []
        self.full = ""
        self.renders = 0

    def render(self, messages: list, generation: bool) -> str:
        if not messages:
            return ""
        self.renders += 1
        self.env.steps = 0
        out, size = [], 0
        for piece in self.template.generate(messages=messages, tools=None, documents=None,
                                            add_generation_prompt=generation, **self.variables):
            size += len(piece)
            if size > MAX_OUTPUT:
                raise Limit(f"the rendering is longer than {MAX_OUTPUT:,} characters")
            out.append(piece)
        return "".join(out)

    def spans(self, train: list[int], roles: list[str], limit: int) -> dict:
        """Learned character ranges: turn i's are render(turns[:i+1]) less render(turns[:i], generation
        prompt), each checked to be a prefix of the whole; turns that start at or past ``limit`` are
        outside the kept tokens and are not rendered (so the work is bounded by the kept window, not by
        the number of turns).

        A template may render a finished turn differently once a later user turn follows (Qwen3 drops the
        thinking block of every assistant turn before the last user query, and closes an empty one in its
        generation prompt when ``enable_thinking`` is false). The range is then the turn as the WHOLE
        conversation renders it: it starts where the whole and the generation prompt part (never before
        the end of the turns before it) and ends where the whole's text stops being the end of the turn
        rendered last: the longest prefix of the whole from the start that is a suffix of that rendering
        (the reply and its close, ``<|im_end|>\\n``, are the same in both)."""
        out = []
        for i in train:
            if roles[i] != "assistant":
                return {"error": f"turn {i} ({roles[i]}) is marked for training, but with a chat template only "
                                 "assistant turns can be (use data.chat_template: builtin)", "kind": "row"}
            before = self.render(self.messages[:i], True)
            upto = None
            if self.full.startswith(before):
                start = len(before)
            else:
                upto = self.render(self.messages[:i + 1], False)
                start = self._header_end(i, before, upto)
                if start is None:
                    return self._unmaskable(i)
            if start >= limit:
                break
            upto = upto if upto is not None else self.render(self.messages[:i + 1], False)
            if self.full.startswith(upto) and upto.startswith(before):
                end = len(upto)
            else:
                done = len(self.render(self.messages[:i], False)) if i else 0
                end = start + _suffix_prefix(upto[done:], self.full[start:start + len(upto) - done])
                if end == start:
                    return self._unmaskable(i)
            out.append([start, end])
        return {"ok": out, "renders": self.renders}

    def _header_end(self, i: int, before: str, upto: str) -> int | None:
        """Where turn ``i``'s reply starts in the whole when the generation prompt is not a prefix of it:
        the end of what they share, if the turns before ``i`` render unchanged and what the whole leaves
        out of the generation prompt is what the template writes there when the turn is the last one
        (Qwen3 with enable_thinking false: its empty thinking block); None otherwise."""
        done = self.render(self.messages[:i], False) if i else ""
        if not (self.full.startswith(done) and before.startswith(done)):
            return None
        n = len(done)
        while n < len(before) and n < len(self.full) and before[n] == self.full[n]:
            n += 1
        return n if n > len(done) and upto.startswith(before) else None

    @staticmethod
    def _unmaskable(i: int) -> dict:
        return {"error": f"its rendering of turns 0..{i} is not a prefix of the whole conversation and its turn "
                         f"{i} cannot be found in it (it rewrites earlier turns beyond their thinking blocks, or "
                         "opens assistant turns differently from its generation prompt)", "kind": "mask"}


def _suffix_prefix(tail: str, text: str) -> int:
    """The length of the longest prefix of ``text`` that is a suffix of ``tail`` (Knuth-Morris-Pratt's
    failure function over text, then tail: linear in their lengths)."""
    seq = list(text) + [None] + list(tail)   # None: a separator no character equals
    fail = [0] * len(seq)
    for k in range(1, len(seq)):
        j = fail[k - 1]
        while j and seq[k] != seq[j]:
            j = fail[j - 1]
        fail[k] = j + 1 if seq[k] == seq[j] else 0
    return fail[-1]


def _answer(worker: Worker | None, req: dict) -> tuple[Worker | None, dict]:
    op = req.get("op")
    try:
        if op == "init":
            return Worker(req["template"], req["variables"]), {"ok": True}
        worker.renders = 0
        if op == "row":   # the whole conversation, kept for later "spans" requests, and the first spans
            worker.messages = req["messages"]
            worker.full = worker.render(worker.messages, False)
        answer = worker.spans(req["train"], [m["role"] for m in worker.messages], req["limit"])
        if op == "row" and "ok" in answer:
            answer["ok"] = [worker.full, answer["ok"], answer.pop("renders")]
        return worker, answer
    except jinja2.TemplateSyntaxError as e:
        return worker, {"error": f"Jinja syntax error at line {e.lineno}: {e.message}", "kind": "syntax",
                        "line": e.lineno}
    except Limit as e:
        return worker, {"error": str(e), "kind": "limit"}
    except jinja2.exceptions.SecurityError as e:   # before TemplateError, its base: never the row's fault
        return worker, {"error": f"the sandbox refused it: {e}", "kind": "limit"}
    except MemoryError:
        return worker, {"error": f"it needs more than the {MEMORY_BYTES >> 30} GiB a chat template may use",
                        "kind": "limit"}
    except RecursionError:
        return worker, {"error": "it recurses without bound (a macro that calls itself?)", "kind": "limit"}
    except Exception as e:  # TemplateError, raise_exception(), a TypeError on a row's values: the row's fault
        return worker, {"error": f"the chat template refused the row: {e}", "kind": "row"}


def _die_with_parent() -> None:
    """SIGKILL when the parent dies (Linux prctl PR_SET_PDEATHSIG), so a killed ``port`` leaves no renderer."""
    try:
        ctypes.CDLL(None).prctl(1, signal.SIGKILL)   # 1 = PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass   # not Linux: EOF on stdin still ends the loop below


def main() -> None:
    _die_with_parent()
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BYTES, MEMORY_BYTES))
    sys.setrecursionlimit(400)
    worker = None
    for line in sys.stdin:
        try:
            worker, answer = _answer(worker, json.loads(line))
            out = json.dumps(answer, ensure_ascii=False)
        except MemoryError:
            out = json.dumps({"error": f"it needs more than the {MEMORY_BYTES >> 30} GiB a chat template may use",
                              "kind": "limit"})
        sys.stdout.write(out + "\n")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
