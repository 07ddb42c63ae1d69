"""Chat templates, tokeniser side files and `port eval`: templates that loop or allocate
without bound, broken or unmaskable templates, named-template lists, oversized or special side files,
and evaluation inputs that would tokenise without bound or index past a vocabulary."""

from __future__ import annotations

import json
import os
from pathlib import Path

from tests.attacks import inputs as I
from tests.attacks.harness import case

CHAT = [{"messages": [{"role": "user", "content": "Hello"}, {"role": "assistant", "content": "Hi there"}]},
        {"messages": [{"role": "user", "content": "Who are you"}, {"role": "assistant", "content": "A helper"}]}]
# A well-formed template (Qwen2's layout) that the bombs below are spliced into.
GOOD = ("{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}")


def _chat(d: Path, rows=CHAT) -> Path:
    p = d / "chat.jsonl"
    p.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return p


def _train_with(d: Path, template: str | bytes, rows=CHAT, name: str = "tpl.jinja") -> list[str]:
    t = d / name
    t.write_bytes(template.encode() if isinstance(template, str) else template)
    r = I.recipe(d, lambda r: r["data"].update(format="chat", chat_template=str(t)), data=_chat(d, rows))
    return ["train", str(r)]


def _template_case(name: str, template: str, *expect: str, timeout: float = 20.0):
    def gen(d: Path) -> list[str]:
        return _train_with(d, template)
    gen.__name__ = name
    globals()[name] = case("tpl.jinja", *expect, timeout=timeout)(gen)


# -- unbounded work: each is stopped within a few seconds, the template file named
for _name, _tpl, _expect in [
    ("nested_range", "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}" + GOOD,
     "loop steps"),
    ("string_times_1e10", "{{ 'x' * 10**10 }}" + GOOD, "repeated 10,000,000,000 times"),
    ("list_times_1e9", "{% set l = [1] * 10**9 %}" + GOOD, "repeated 1,000,000,000 times"),
    ("power_tower", "{{ 9 ** (9 ** 9) }}" + GOOD, "bits"),
    ("lipsum_1e6", "{{ lipsum(n=10**6) }}" + GOOD, "lipsum"),
    ("tojson_indent_1e8", "{{ messages|tojson(indent=10**8) }}" + GOOD, "tojson indent"),
    ("center_1e10", "{{ 'x'|center(10**10) }}" + GOOD, "center width"),
    ("indent_1e9", "{{ 'a\nb'|indent(10**9) }}" + GOOD, "indent"),
    ("recursive_macro", "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}" + GOOD, "recurses"),
    ("macro_fan_out", "{% macro f(n) %}{% if n %}{{ f(n - 1) }}{{ f(n - 1) }}{% endif %}{% endmacro %}{{ f(60) }}"
     + GOOD, "stopped"),
    ("string_loop_no_calls", "{% set s = 'x' * 99999 %}{% for a in s %}{% for b in s %}{% endfor %}{% endfor %}"
     + GOOD, "longer than 5 s"),
    ("namespace_doubling", "{% set ns = namespace(s='xx') %}{% for i in range(64) %}{% set ns.s = ns.s ~ ns.s %}"
     "{% endfor %}" + GOOD, "stopped"),
    ("replace_quadratic", "{% set s = 'x' * 100000 %}{{ s|replace('x', s) }}" + GOOD, "stopped"),
    ("format_width_1e9", "{{ '{:>999999999}'.format('x') }}" + GOOD, "stopped"),
    ("output_1e9_characters", "{% for i in range(99999) %}{{ 'y' * 60000 }}{% endfor %}" + GOOD, "stopped"),
]:
    _template_case(_name, _tpl, _expect)


@case("tpl.jinja", "stopped")
def row_triggered_loop(d):
    """A template that behaves on the probe and loops on one row's content."""
    bomb = "{% for m in messages %}{% if 'boom' in m['content'] %}{% for i in range(99999) %}{% for j in " \
           "range(99999) %}{% endfor %}{% endfor %}{% endif %}{% endfor %}" + GOOD
    rows = CHAT + [{"messages": [{"role": "user", "content": "boom"}, {"role": "assistant", "content": "x"}]}]
    return _train_with(d, bomb, rows)


# -- templates that cannot be used: one line, the file named, with the reason
_template_case("syntax_error", "{% for m in messages %}\n{{ m['content'] }\n{% endfor %}", "Jinja syntax error at line 2")
_template_case("unclosed_block", GOOD + "\n{% if add_generation_prompt %}", "Jinja syntax error")
_template_case("no_generation_prompt_branch",
               "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}",
               "no add_generation_prompt branch")
_template_case("sandbox_escape_attempt", "{{ ''.__class__.__mro__[1].__subclasses__() }}" + GOOD, "sandbox refused")
_template_case("namespace_dunder", "{% set ns = namespace() %}{% set ns.__class__ = 1 %}" + GOOD, "sandbox refused")


@case("tpl.jinja", "not valid UTF-8")
def template_not_utf8(d):
    return _train_with(d, I.NOT_UTF8)


@case("tpl.jinja", "more than")
def template_of_2_mb(d):
    return _train_with(d, "{# " + "x" * (2 << 20) + " #}" + GOOD)


@case("tpl.jinja", "regular file", timeout=30)
def template_is_a_fifo(d):
    os.mkfifo(d / "tpl.jinja")
    r = I.recipe(d, lambda r: r["data"].update(format="chat", chat_template=str(d / "tpl.jinja")), data=_chat(d))
    return ["train", str(r)]


# -- the model's own template and tokeniser side files
def _model_case(name: str, edit, *expect: str, template: str = "model"):
    def gen(d: Path) -> list[str]:
        m = I.hf(d)
        edit(m)
        r = I.recipe(d, lambda r: (r["model"].update(source=str(m)),
                                   r["data"].update(format="chat", chat_template=template)), data=_chat(d))
        return ["train", str(r)]
    gen.__name__ = name
    globals()[name] = case(*expect, timeout=30)(gen)


def _config_edit(**fields):
    def edit(m: Path) -> None:
        I.update_json(m / "tokenizer_config.json", **fields)
    return edit


_model_case("named_templates_no_default", _config_edit(chat_template=[{"name": "tool_use", "template": GOOD},
                                                                      {"name": "rag", "template": GOOD}]),
            "named chat templates ['rag', 'tool_use']", "none is called 'default'")
_model_case("named_template_missing", _config_edit(chat_template=[{"name": "default", "template": GOOD}]),
            "none is called 'tools'", template="model:tools")
_model_case("config_template_of_2_mb", _config_edit(chat_template="{# " + "x" * (2 << 20) + " #}" + GOOD),
            "tokenizer_config.json", "more than the 1,048,576")
_model_case("named_config_template_of_2_mb", _config_edit(chat_template=[{"name": "default", "template":
            "{# " + "x" * (2 << 20) + " #}" + GOOD}]), "tokenizer_config.json (default)", "more than the 1,048,576")
_model_case("model_template_loops", _config_edit(chat_template=[{"name": "default", "template":
            "{% for i in range(99999) %}{% for j in range(99999) %}{% endfor %}{% endfor %}" + GOOD}]),
            "tokenizer_config.json (default)", "loop steps")
_model_case("chat_template_jinja_fifo", lambda m: os.mkfifo(m / "chat_template.jinja"), "chat_template.jinja",
            "regular file")
_model_case("chat_template_jinja_2_mb", lambda m: (m / "chat_template.jinja").write_text("x" * (2 << 20)),
            "chat_template.jinja", "more than")
_model_case("chat_template_jinja_syntax", lambda m: (m / "chat_template.jinja").write_text("{% for %}"),
            "chat_template.jinja", "Jinja syntax error at line 1")
_model_case("tokenizer_config_17_mb", lambda m: I.big_sparse(m / "tokenizer_config.json", 17 << 20),
            "tokenizer_config.json", "more than")
_model_case("tokenizer_config_deep", lambda m: (m / "tokenizer_config.json").write_text(I.deep_object()),
            "tokenizer_config.json", "nest")
_model_case("special_tokens_map_huge_int", lambda m: (m / "special_tokens_map.json").write_text(
            '{"bos_token": ' + "9" * 5000 + "}"), "special_tokens_map.json", "digits")
_model_case("too_many_named_template_files", lambda m: [
            (m / "additional_chat_templates").mkdir(), *[(m / "additional_chat_templates" / f"t{i}.jinja").write_text(GOOD)
                                                        for i in range(70)]], "additional_chat_templates", "70 files")


# -- port eval
@case("--reference", "vocab_size 32", "--no-reference", timeout=60)
def eval_reference_tiny_vocab(d):
    ref = I.edit_config(I.hf(d, "ref"), vocab_size=32)
    return ["eval", "--hf", str(I.EMBEDDED), "--data", str(I.SAMPLE_TEXT), "--reference", str(ref)]


@case(dest=None, refusal=False, timeout=90)
def eval_one_line_of_64_mb(d):
    """A 64 MB line (no newline): cut to what 64 tokens can cover before it is tokenised (bounded time
    and memory; the harness bounds both)."""
    p = d / "long.txt"
    with open(p, "w") as f:
        for _ in range(64):
            f.write("Once upon a time there was a cat. " * 30840)
    return ["eval", "--hf", str(I.EMBEDDED), "--data", str(p), "--max-seq-length", "64", "--no-reference"]
