"""Row formats of fine-tuning data, as users bring them: from one parsed row to what is tokenised.

A row becomes either :data:`Segments` (plain text; Alpaca with the recipe's prompt template) or a
:class:`Conversation` (OpenAI ``messages``, ShareGPT ``conversations``, Alpaca with ``system`` /
``history`` under a chat template), which :mod:`porting.train.data.chat` renders. Every problem of a row
is a ``ValueError`` whose message the data pipeline counts with the row number.

Formats and their sources (the test samples under ``tests/train/fixtures/`` are real files):

* ``text``: ``{"<text_field>": str}`` rows, or a ``.txt`` file split on ``data.separator``.
* ``alpaca``: ``instruction`` / ``input`` / ``output``, optional ``system`` and ``history``
  (``[[prompt, response], ...]``, responses learned), as LLaMA-Factory's data/README.md documents.
* ``chat``: OpenAI ``{"messages": [{"role", "content"}]}``; ``content`` a string or a list of parts
  ``{"type": "text", "text" | "value": str}`` (``reasoning`` and ``tool_call`` parts are kept as
  text); a message's ``train: false`` or ``loss_weight: 0`` keeps it out of the loss.
* ``sharegpt``: ``{"conversations": [{"from", "value"}], "system"?}`` with role names mapped
  (``human`` -> user, ``gpt`` -> assistant, ``observation`` -> tool, ...); the keys and the role map
  are ``data.sharegpt.*``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Sequence, Union

from model_zoo.errors import RecipeError

Segments = list[tuple[str, bool]]   # (text, counts in the loss)

ROLES = ("system", "user", "assistant", "tool")
# LLaMA-Factory's ShareGPT tags (data/README.md) and the OpenAI names, mapped to ROLES.
SHAREGPT_ROLES = {"human": "user", "user": "user", "gpt": "assistant", "assistant": "assistant",
                  "system": "system", "function_call": "assistant", "observation": "tool", "tool": "tool"}
MAX_TURNS = 4096


@dataclass(frozen=True)
class Turn:
    role: str        # one of ROLES
    content: str
    train: bool      # counts in the loss


@dataclass(frozen=True)
class Conversation:
    turns: tuple[Turn, ...]

    def messages(self) -> list[dict]:
        """The turns as the ``messages`` list a chat template takes."""
        return [{"role": t.role, "content": t.content} for t in self.turns]


Rendered = Union[Segments, Conversation]


# --------------------------------------------------------------------------- field helpers
def need_str(row: dict, key: str, optional: bool = False) -> str:
    if key not in row:
        if optional:
            return ""
        raise ValueError(f"missing key {key!r}")
    v = row[key]
    if v is None and optional:
        return ""
    if not isinstance(v, str):
        raise ValueError(f"key {key!r} must be a string, got {type(v).__name__}")
    return v


def _content(value: Any, where: str) -> str:
    """A message's content: a string, or OpenAI / LLaMA-Factory content parts joined."""
    if isinstance(value, str):
        return value
    if not isinstance(value, list):
        raise ValueError(f"{where} must be a string or a list of parts, got {type(value).__name__}")
    out = []
    for j, part in enumerate(value):
        if not isinstance(part, dict):
            raise ValueError(f"{where}[{j}] must be an object with type and text, got {type(part).__name__}")
        kind = part.get("type", "text")
        text = part.get("text", part.get("value"))
        if kind not in ("text", "reasoning", "tool_call"):
            raise ValueError(f"{where}[{j}].type {kind!r} is not supported (text, reasoning, tool_call); "
                             "image and audio parts need a multimodal model")
        if not isinstance(text, str):
            raise ValueError(f"{where}[{j}] needs a string 'text' or 'value'")
        # LLaMA-Factory renders reasoning as a <think> block in front of the answer.
        out.append(f"<think>\n{text}\n</think>\n\n" if kind == "reasoning" else text)
    return "".join(out)


def _train_flag(m: dict, role: str, where: str) -> bool:
    if "train" in m:
        if not isinstance(m["train"], bool):
            raise ValueError(f"{where}.train must be true or false, got {m['train']!r}")
        return m["train"]
    if "loss_weight" in m:
        w = m["loss_weight"]
        if isinstance(w, bool) or not isinstance(w, (int, float)) or w not in (0, 1):
            raise ValueError(f"{where}.loss_weight {w!r}: only 0 or 1 are supported (tokens are masked, not "
                             "weighted)")
        return w == 1
    return role == "assistant"


def _conversation(turns: list[Turn]) -> Conversation:
    if not any(t.train for t in turns):
        raise ValueError("no assistant message to learn from")
    return Conversation(tuple(turns))


# --------------------------------------------------------------------------- the formats
def _history(row: dict) -> list[tuple[str, str]]:
    h = row.get("history") or []
    if not isinstance(h, list) or len(h) > MAX_TURNS:
        raise ValueError("key 'history' must be a list of [prompt, response] pairs")
    for i, pair in enumerate(h):
        if not (isinstance(pair, (list, tuple)) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            raise ValueError(f"history[{i}] must be a [prompt, response] pair of strings")
    return [(q, a) for q, a in h]


def alpaca_row(row: Any, data, as_chat: bool, plain: Callable[[Any, Any], Segments]) -> Rendered:
    """Alpaca with optional system and history. Without a chat template, ``plain`` (the recipe's prompt
    templates) formats each prompt/response pair and the system prompt goes first; with one
    (``as_chat``) it is a conversation whose prompt is ``instruction\ninput``, as in LLaMA-Factory."""
    if not isinstance(row, dict):
        raise ValueError(f"expected an object with instruction/input/output, got {type(row).__name__}")
    system, history = need_str(row, "system", True), _history(row)
    if not as_chat:
        segs: Segments = [(system + "\n\n", False)] if system else []
        for q, a in history:
            pair = plain({"instruction": q, "output": a}, data)
            segs += pair[:-1] + [(pair[-1][0] + "\n\n", True)]
        return segs + plain(row, data)
    instr, inp, out = need_str(row, "instruction"), need_str(row, "input", True), need_str(row, "output")
    if not out.strip():
        raise ValueError("empty 'output'")
    turns = [Turn("system", system, False)] if system else []
    for q, a in history:
        turns += [Turn("user", q, False), Turn("assistant", a, True)]
    prompt = f"{instr}\n{inp}" if inp.strip() else instr
    return _conversation(turns + [Turn("user", prompt, False), Turn("assistant", out, True)])


def chat_row(row: Any, data) -> Conversation:
    if not isinstance(row, dict) or not isinstance(row.get("messages"), list):
        raise ValueError("expected an object with a 'messages' list")
    return _turns(row["messages"], "messages", "role", "content", {r: r for r in ROLES}, None)


def sharegpt_row(row: Any, data) -> Conversation:
    s = data.sharegpt
    if not isinstance(row, dict) or not isinstance(row.get(s.messages_key), list):
        raise ValueError(f"expected an object with a {s.messages_key!r} list")
    roles = {**SHAREGPT_ROLES, **s.roles}
    system = need_str(row, s.system_key, True) if s.system_key else ""
    return _turns(row[s.messages_key], s.messages_key, s.role_key, s.content_key, roles, system)


def _turns(msgs: list, key: str, role_key: str, content_key: str, roles: dict, system: str | None) -> Conversation:
    if len(msgs) > MAX_TURNS:
        raise ValueError(f"{key} has {len(msgs)} messages, more than {MAX_TURNS}")
    turns = [Turn("system", system, False)] if system else []
    for i, m in enumerate(msgs):
        where = f"{key}[{i}]"
        if not isinstance(m, dict):
            raise ValueError(f"{where} must be an object with {role_key} and {content_key}")
        name = need_str(m, role_key)
        if name not in roles:
            hint = " (map it with data.sharegpt.roles)" if key != "messages" else ""
            raise ValueError(f"{where}.{role_key} {name!r} is not one of {sorted(roles)}{hint}")
        if content_key not in m:
            raise ValueError(f"{where}: missing key {content_key!r}")
        role = roles[name]
        turns.append(Turn(role, _content(m[content_key], f"{where}.{content_key}"), _train_flag(m, role, where)))
    return _conversation(turns)


# text and alpaca rows are read by porting.train.data (text_segments, alpaca_segments -> alpaca_row).
ROW_FORMATS: dict[str, Callable[[Any, Any], Conversation]] = {"chat": chat_row, "sharegpt": sharegpt_row}


def detect_format(rows: Sequence[tuple[int, Any]], data) -> str:
    """The format of the first row that names one (messages, conversations, instruction, text)."""
    keys = (("chat", "messages"), ("sharegpt", data.sharegpt.messages_key), ("alpaca", "instruction"),
            ("text", data.text_field))
    for _, r in rows:
        if isinstance(r, dict):
            for fmt, key in keys:
                if key in r:
                    return fmt
    raise RecipeError(f"{data.path}: cannot tell the format: no row has 'messages' (chat), "
                      f"'{data.sharegpt.messages_key}' (sharegpt), 'instruction' (alpaca) or "
                      f"'{data.text_field}' (text); set data.format or data.text_field")


# --------------------------------------------------------------------------- built-in markers
BUILTIN_MARKER = "<|{role}|>\n"


def builtin_segments(conv: Conversation) -> Segments:
    """A conversation in port's own ``<|role|>`` markers (the named fallback ``data.chat_template:
    builtin``); the marker never counts in the loss, a trained turn's text and newline do."""
    segs: Segments = []
    for t in conv.turns:
        segs.append((BUILTIN_MARKER.format(role=t.role), False))
        segs.append((t.content + "\n", t.train))
    return segs
