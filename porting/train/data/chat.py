"""Conversations through a chat template, with the loss on assistant turns only, exactly.

``data.chat_template`` chooses how a :class:`~porting.train.data.formats.Conversation` becomes tokens:

* ``model``: the tokenizer's own ``chat_template`` (``apply_chat_template``), so a Llama-3-Instruct or
  Qwen2-Instruct fine-tune is trained on the format it sees at inference (the default when the
  tokenizer has a template);
* a path to a Jinja file: that template, rendered the same way;
* ``builtin``: port's own ``<|role|>`` markers (the default when the tokenizer has no template).

How the mask is made exact: the whole conversation is rendered to one string and tokenised once
(what inference sees). An assistant turn's characters are ``render(turns[:i+1])`` minus
``render(turns[:i], add_generation_prompt=True)``: the reply and whatever the template closes it
with (``<|eot_id|>``, ``<|im_end|>``, ``</s>``), but never the header that opens it. A token is in
the loss when its character span lies inside such a range; a token that crosses a range's edge
makes the row malformed (counted) unless its part of the range is whitespace (then it is left out),
and the characters of the kept tokens are checked to equal the ranges less that whitespace. A template
that renders a finished turn differently once later turns follow (Qwen3 drops the thinking block of turns
before the last user query) is masked on the WHOLE conversation's rendering of each turn: the reply and
its close as they appear there, found by the worker (``template_worker.Worker.spans``); so the loss covers
exactly what the template renders, Qwen3's ``<think>...</think>`` of the last turn included, and with
``data.enable_thinking: false`` the empty thinking block its generation prompt adds is prompt, not loss.
A template that rewrites earlier turns beyond that is refused when the run starts, and so is one whose
generation prompt cannot be separated from the reply (no ``add_generation_prompt`` branch: the assistant
header would be learned).

Rendering runs in a bounded worker process (:mod:`porting.train.data.template_worker`: time, memory
and output limits) and only the turns that start inside the kept ``max_seq_length`` tokens get their
prefix renders, so masking a row is linear in its number of turns (one full render) plus a bounded
amount of work for the kept window; the rendered text is cut before it is tokenised
(:func:`porting.train.data.cut.char_bound`).
"""

from __future__ import annotations

import re
from pathlib import Path

from model_zoo.errors import RecipeError
from model_zoo.files import read_text
from model_zoo.labels import IGNORE_INDEX
from porting.train.data.cut import char_bound
from porting.train.data.formats import Conversation, Turn
from porting.tokenizer import MAX_TEMPLATE_BYTES
from porting.train.data.template_process import TemplateProcess, WorkerFailure

MAX_ROW_CHARS = 16 << 20      # characters of one conversation's messages (the worker's output cap is 4x this)
SPANS_PER_REQUEST = 16       # trained turns whose prefix renders one worker request checks
CHAT_TEMPLATE_FILE = "chat_template.jinja"   # where transformers >= 4.50 saves a model's template


# A reasoning block a template writes before the reply (Qwen3: an empty one on the last turn); it is the
# model's output, so it may open a learned range, where an assistant header may not.
_THINK_BLOCK = re.compile(r"^\s*<think>.*?</think>", re.S)


class TemplateMaskError(RecipeError):
    """The chat template renders a conversation's beginning differently once more turns follow."""

# A probe conversation every template must mask exactly before any data is read.
_PROBE = Conversation((Turn("user", "Probe question one?", False), Turn("assistant", "Probe answer one.", True),
                       Turn("user", "Probe question two?", False), Turn("assistant", "Probe answer two.", True)))


def _model_template(tokenizer, choice: str, model_dir: str) -> tuple[str | None, str]:
    """The tokenizer's own template and the file it came from. A list of named templates in
    ``tokenizer_config.json`` (``[{"name": "default", "template": ...}, ...]``) is a dict by the time the
    tokenizer is loaded (transformers, ``PreTrainedTokenizerBase.__init__``: ``{t["name"]: t["template"]}``);
    like ``get_chat_template`` without tools, ``model`` takes ``default``, and ``model:NAME`` takes NAME."""
    own = getattr(tokenizer, "chat_template", None)
    d = Path(model_dir)
    source = str(d / CHAT_TEMPLATE_FILE) if (d / CHAT_TEMPLATE_FILE).is_file() else str(d / "tokenizer_config.json")
    if isinstance(own, dict):
        name = choice.partition(":")[2] or "default"
        if name not in own or not isinstance(own[name], str):
            raise RecipeError(f"data.chat_template: {choice}: the tokenizer of {model_dir} has the named chat "
                              f"templates {sorted(map(str, own))} and none is called {name!r}; set "
                              "data.chat_template to model:NAME with one of them, a Jinja file, or builtin")
        return _bounded(own[name], f"{source} ({name})"), f"{source} ({name})"
    if ":" in choice:
        raise RecipeError(f"data.chat_template: {choice}: the tokenizer of {model_dir} has one chat template, "
                          "not named ones; use model")
    return (_bounded(own, source) if isinstance(own, str) else None), source


def _bounded(template: str, source: str) -> str:
    """A template held inside tokenizer_config.json, bounded like a template file."""
    if len(template) > MAX_TEMPLATE_BYTES:
        raise RecipeError(f"data.chat_template ({source}): the chat template has {len(template):,} characters, more "
                          f"than the {MAX_TEMPLATE_BYTES:,} a chat template may have; this is not a template port "
                          "renders")
    return template


def choose_template(data, tokenizer, model_dir: str = "the model") -> tuple[str | None, str]:
    """The Jinja template ``data.chat_template`` asks for (None for the built-in markers) and the file it
    comes from (named in every error about it)."""
    choice = data.chat_template
    if choice == "builtin":
        return None, "builtin"
    if choice in ("model", "auto") or choice.startswith("model:"):
        own, source = _model_template(tokenizer, choice, model_dir)
        if own is None and choice != "auto":
            raise RecipeError(f"data.chat_template: model, but the tokenizer of {model_dir} has no chat_template; "
                              "set data.chat_template to a Jinja file or to builtin")
        return own, source
    path = Path(choice).expanduser()
    return read_text(path, what="chat template (data.chat_template)", max_bytes=MAX_TEMPLATE_BYTES,
                     error=RecipeError), str(path)


def max_token_chars(tokenizer) -> int:
    """Characters the longest vocabulary entry can decode to (an upper bound per token)."""
    return max((len(t) for t in tokenizer.get_vocab()), default=1)


class TemplateRenderer:
    """Token ids and labels of a conversation rendered with one chat template (in a bounded worker)."""

    def __init__(self, tokenizer, template: str, name: str, enable_thinking: bool | None = None):
        self.tok, self.template, self.name = tokenizer, template, name
        self.renders = 0
        if not getattr(tokenizer, "is_fast", False):
            raise RecipeError(f"data.chat_template ({name}): exact masking needs a fast tokenizer (tokenizer.json) "
                              "for character offsets; add tokenizer.json or set data.chat_template: builtin")
        self.token_chars = max_token_chars(tokenizer)
        self.chars_per_token = 4.0   # grows to the largest ratio seen in a cut row (guesses the window's end)
        try:
            variables = dict(getattr(tokenizer, "special_tokens_map", {}) or {})
            if enable_thinking is not None:   # as apply_chat_template(enable_thinking=...) passes it
                variables["enable_thinking"] = enable_thinking
            self.proc = TemplateProcess(template, variables)
            ids, labels, spans, text = self._encode(_PROBE, None)
        except TemplateMaskError:
            raise
        except (ValueError, WorkerFailure) as exc:
            raise self._refusal(exc) from None
        for t, (a, b) in zip(_PROBE.turns[1::2], spans):
            if not _THINK_BLOCK.sub("", text[a:b], count=1).lstrip().startswith(t.content):
                raise RecipeError(f"data.chat_template ({name}): the learned range of an assistant turn starts "
                                  f"with {text[a:b][:40]!r}, not with the reply: the template has no "
                                  "add_generation_prompt branch that renders the assistant header, so the header "
                                  "cannot be kept out of the loss; add one ({% if add_generation_prompt %}...) or "
                                  "set data.chat_template: builtin")

    def _refusal(self, exc: Exception) -> RecipeError:
        if isinstance(exc, WorkerFailure) and exc.kind == "syntax":
            return RecipeError(f"data.chat_template ({self.name}): {exc}; fix the template")
        if isinstance(exc, WorkerFailure) and exc.kind == "limit":
            return RecipeError(f"data.chat_template ({self.name}): the template was stopped: {exc}; a chat "
                               "template renders messages, it does not compute")
        if isinstance(exc, ValueError) and str(exc).startswith("the chat template refused"):
            return RecipeError(f"data.chat_template ({self.name}): the template fails on a plain probe conversation "
                               f"(user, assistant, user, assistant): {exc}; fix the template or set "
                               "data.chat_template: builtin")
        return RecipeError(f"data.chat_template ({self.name}): the template cannot be masked exactly: {exc}; use a "
                           "template that renders each turn after the ones before it, or data.chat_template: "
                           "builtin")

    def close(self) -> None:
        self.proc.close()

    def spans(self, conv: Conversation, limit: int | None = None) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and the character ranges that count in the loss (of the trained turns
        that start before character ``limit``)."""
        full, spans, _ = self._render(conv, limit)
        return full, spans

    def _ask(self, request: dict):
        try:
            return self.proc.ask(request)
        except WorkerFailure as exc:
            if exc.kind == "row":
                raise ValueError(str(exc)) from None
            if exc.kind == "mask":
                raise TemplateMaskError(f"data.chat_template ({self.name}): the template cannot be masked exactly: "
                                        f"{exc}; use a template that renders each turn after the ones before it, "
                                        "or data.chat_template: builtin") from None
            raise self._refusal(exc) from None

    def _render(self, conv: Conversation, guess: int | None):
        """The whole conversation and the spans of its first :data:`SPANS_PER_REQUEST` trained turns that
        start before character ``guess`` (None: all), in one request; :meth:`_more_spans` asks the rest."""
        messages = conv.messages()
        if sum(len(m["content"]) for m in messages) > MAX_ROW_CHARS:
            raise ValueError(f"the conversation has more than {MAX_ROW_CHARS:,} characters, more than port renders "
                             "through a chat template (porting.train.data.chat.MAX_ROW_CHARS); split it")
        train = [i for i, t in enumerate(conv.turns) if t.train]
        full, found, renders = self._ask({"op": "row", "messages": messages, "train": train[:SPANS_PER_REQUEST],
                                          "limit": MAX_ROW_CHARS * 4 if guess is None else guess})
        self.renders += renders
        spans = [(a, b) for a, b in found]
        stopped_at = guess if len(found) < min(len(train), SPANS_PER_REQUEST) else None
        return full, self._more_spans(train, spans, stopped_at, len(full) if guess is None else guess), train

    def _more_spans(self, train: list[int], spans: list, stopped_at: int | None, limit: int) -> list:
        """The spans of the trained turns after ``spans`` that start before ``limit``, asked
        :data:`SPANS_PER_REQUEST` turns at a time (each request's deadline covers bounded work however long
        the kept window is). ``stopped_at``: the limit the last request stopped at, if it stopped."""
        while len(spans) < len(train) and (stopped_at is None or stopped_at < limit):
            part = train[len(spans):len(spans) + SPANS_PER_REQUEST]
            found, renders = self._ask({"op": "spans", "train": part, "limit": limit})
            self.renders += renders
            spans += [(a, b) for a, b in found]
            stopped_at = limit if len(found) < len(part) else None
        return spans

    def _encode(self, conv: Conversation, max_len: int | None):
        """Ids and labels of the rendered conversation, cut before tokenising to what ``max_len`` tokens
        can cover (one token decodes to at most ``token_chars`` characters); at most ``max_len + 1``
        tokens are returned, so a longer row is still counted as truncated. The spans are first asked up
        to a guess of where the kept tokens end (from the rows before), then up to where they do end."""
        guess = None if max_len is None else int(max_len * self.chars_per_token * 1.25) + 64
        text, spans, train = self._render(conv, guess)
        cut = None if max_len is None else char_bound(max_len, self.token_chars)
        enc = self.tok(text[:cut], add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
        if max_len is not None and len(ids) > max_len:
            ids, offsets = ids[:max_len + 1], offsets[:max_len + 1]
            end = max(e for _, e in offsets)
            self.chars_per_token = max(self.chars_per_token, end / len(ids))
            if end > guess:   # the kept tokens reach past the guess: the turns in between are asked too
                spans = self._more_spans(train, spans, guess, end)
        return (*self._labels(text, ids, offsets, spans), spans, text)

    @staticmethod
    def _labels(text: str, ids: list[int], offsets: list, spans: list[tuple[int, int]]) -> tuple[list, list]:
        """Labels by one sweep over tokens and spans (both in text order): linear in tokens + spans."""
        labels, kept, dropped, j = [], set(), set(), 0
        for tid, (s, e) in zip(ids, offsets):
            while j < len(spans) and spans[j][1] <= s:
                j += 1
            inside = e > s and j < len(spans) and spans[j][0] <= s and e <= spans[j][1]
            overlap = [c for a, b in spans[j:j + 2] for c in range(max(s, a), min(e, b))] if not inside else []
            if overlap:
                # A token that joins a turn's edge to its neighbour is left out only when its part of the
                # turn is whitespace (Mistral's "</s> " before "[INST]"); anything else cannot be masked.
                if text[min(overlap):max(overlap) + 1].strip():
                    raise ValueError(f"token {tid} covering characters {s}..{e} ({text[s:e]!r}) crosses the edge "
                                     "of an assistant turn")
                dropped.update(overlap)
            labels.append(tid if inside else IGNORE_INDEX)
            if inside:
                kept.update(range(s, e))
        end = max((e for _, e in offsets), default=0)   # characters past the last token kept are not checked
        want = {c for a, b in spans if a < end for c in range(a, min(b, end))} - dropped
        if kept != want:
            raise ValueError(f"the kept tokens cover {len(kept)} characters, the assistant turns {len(want)}")
        return ids, labels

    def encode(self, conv: Conversation, max_len: int | None = None) -> tuple[list[int], list[int]]:
        ids, labels, _, _ = self._encode(conv, max_len)
        return ids, labels


def renderer_for(fmt: str, data, tokenizer) -> TemplateRenderer | None:
    """The renderer ``fmt`` rows need, or None (plain text, prompt templates, built-in markers)."""
    if fmt == "text" or (fmt == "alpaca" and data.chat_template in ("auto", "builtin")):
        return None
    template, source = choose_template(data, tokenizer, getattr(tokenizer, "name_or_path", None) or "the model")
    return TemplateRenderer(tokenizer, template, source, getattr(data, "enable_thinking", None)) \
        if template is not None else None
