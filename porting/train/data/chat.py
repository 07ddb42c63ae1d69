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
and the characters of the kept tokens are checked to equal the ranges less that whitespace. A template whose rendering of a conversation's beginning is not a prefix of the whole (one
that drops earlier reasoning, say) cannot be masked this way and is refused when the run starts.
"""

from __future__ import annotations

from pathlib import Path

from model_zoo.errors import RecipeError
from model_zoo.files import read_text
from model_zoo.labels import IGNORE_INDEX
from porting.train.data.formats import Conversation, Turn

MAX_TEMPLATE_BYTES = 1 << 20


class TemplateMaskError(RecipeError):
    """The chat template renders a conversation's beginning differently once more turns follow."""

# A probe conversation every template must mask exactly before any data is read.
_PROBE = Conversation((Turn("user", "Probe question one?", False), Turn("assistant", "Probe answer one.", True),
                       Turn("user", "Probe question two?", False), Turn("assistant", "Probe answer two.", True)))


def choose_template(data, tokenizer, model_dir: str = "the model") -> str | None:
    """The Jinja template ``data.chat_template`` asks for, or None for the built-in markers."""
    choice = data.chat_template
    own = tokenizer.chat_template if isinstance(getattr(tokenizer, "chat_template", None), str) else None
    if choice == "builtin" or (choice == "auto" and own is None):
        return None
    if choice in ("model", "auto"):
        if own is None:
            raise RecipeError(f"data.chat_template: model, but the tokenizer of {model_dir} has no chat_template; "
                              "set data.chat_template to a Jinja file or to builtin")
        return own
    return read_text(Path(choice).expanduser(), what="chat template (data.chat_template)",
                     max_bytes=MAX_TEMPLATE_BYTES, error=RecipeError)


class TemplateRenderer:
    """Token ids and labels of a conversation rendered with one chat template."""

    def __init__(self, tokenizer, template: str, name: str):
        self.tok, self.template, self.name = tokenizer, template, name
        if not getattr(tokenizer, "is_fast", False):
            raise RecipeError(f"data.chat_template ({name}): exact masking needs a fast tokenizer (tokenizer.json) "
                              "for character offsets; add tokenizer.json or set data.chat_template: builtin")
        try:
            ids, labels, spans, text = self._encode(_PROBE)
        except TemplateMaskError:
            raise
        except ValueError as exc:
            raise RecipeError(f"data.chat_template ({name}): the template cannot be masked exactly: {exc}; use a "
                              "template that renders each turn after the ones before it, or data.chat_template: "
                              "builtin") from None
        for t in _PROBE.turns[1::2]:
            if not any(t.content in text[a:b] for a, b in spans):
                raise RecipeError(f"data.chat_template ({name}): an assistant reply is not inside its masked range; "
                                  "the template does not render assistant content where port can find it")

    def render(self, turns, generation: bool) -> str:
        if not turns:
            return ""
        return self.tok.apply_chat_template([{"role": t.role, "content": t.content} for t in turns],
                                            chat_template=self.template, tokenize=False,
                                            add_generation_prompt=generation)

    def spans(self, conv: Conversation) -> tuple[str, list[tuple[int, int]]]:
        """The rendered conversation and the character ranges that count in the loss."""
        turns = list(conv.turns)
        try:
            full = self.render(turns, False)
            out = []
            for i, t in enumerate(turns):
                if not t.train:
                    continue
                if t.role != "assistant":
                    raise ValueError(f"turn {i} ({t.role}) is marked for training, but with a chat template only "
                                     "assistant turns can be (use data.chat_template: builtin)")
                before, upto = self.render(turns[:i], True), self.render(turns[:i + 1], False)
                if not (full.startswith(upto) and upto.startswith(before)):
                    raise TemplateMaskError(
                        f"data.chat_template ({self.name}): the template cannot be masked exactly: its rendering of "
                        f"turns 0..{i} is not a prefix of the whole conversation (it rewrites earlier turns, e.g. drops "
                        "their reasoning, or opens assistant turns differently from its generation prompt); use a "
                        "template that renders each turn after the ones before it, or data.chat_template: builtin")
                out.append((len(before), len(upto)))
        except (ValueError, RecipeError):
            raise
        except Exception as exc:  # jinja2 TemplateError, raise_exception() in the template
            raise ValueError(f"the chat template refused the row: {exc}") from None
        return full, out

    def _encode(self, conv: Conversation) -> tuple[list[int], list[int], list[tuple[int, int]], str]:
        text, spans = self.spans(conv)
        enc = self.tok(text, add_special_tokens=False, return_offsets_mapping=True)
        ids, offsets = list(enc["input_ids"]), list(enc["offset_mapping"])
        labels, kept, dropped = [], set(), set()
        for tid, (s, e) in zip(ids, offsets):
            inside = e > s and any(a <= s and e <= b for a, b in spans)
            overlap = [c for a, b in spans for c in range(max(s, a), min(e, b))]
            if not inside and overlap:
                # A token that joins a turn's edge to its neighbour is left out only when its part of the
                # turn is whitespace (Mistral's "</s> " before "[INST]"); anything else cannot be masked.
                if text[min(overlap):max(overlap) + 1].strip():
                    raise ValueError(f"token {tid} covering characters {s}..{e} ({text[s:e]!r}) crosses the edge "
                                     "of an assistant turn")
                dropped.update(overlap)
            labels.append(tid if inside else IGNORE_INDEX)
            if inside:
                kept.update(range(s, e))
        want = set().union(*(range(a, b) for a, b in spans)) - dropped if spans else set()
        if kept != want:
            raise ValueError(f"the kept tokens cover {len(kept)} characters, the assistant turns {len(want)}")
        return ids, labels, spans, text

    def encode(self, conv: Conversation) -> tuple[list[int], list[int]]:
        ids, labels, _, _ = self._encode(conv)
        return ids, labels


def renderer_for(fmt: str, data, tokenizer) -> TemplateRenderer | None:
    """The renderer ``fmt`` rows need, or None (plain text, prompt templates, built-in markers)."""
    if fmt == "text" or (fmt == "alpaca" and data.chat_template in ("auto", "builtin")):
        return None
    template = choose_template(data, tokenizer, getattr(tokenizer, "name_or_path", "the model"))
    return TemplateRenderer(tokenizer, template, data.chat_template) if template is not None else None
