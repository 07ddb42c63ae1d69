"""The model's own tokenizer, loaded the one way `port` does it: from the model directory, offline.

Used by `port generate`, `port verify --generate`, `port train` and `port baseline`. Nothing is fetched
from the hub (``local_files_only``), and every failure is one ``ConfigError`` line that names the
directory and the file that is missing or unreadable.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from model_zoo.errors import ConfigError
from model_zoo.files import MAX_JSON_BYTES, read_json_object, read_text

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

# What HF fast tokenizers save (read by the `tokenizers` library), and the SentencePiece model that
# older Llama repositories ship instead (read only when the sentencepiece package is installed).
TOKENIZER_FILE = "tokenizer.json"
SENTENCEPIECE_FILE = "tokenizer.model"
CONFIG_FILE = "tokenizer_config.json"
# Sequence lengths are checked by the model (rope length, sliding window) and cut by the data pipeline,
# so the tokenizer's own length warning would only repeat them.
UNBOUNDED_LENGTH = 1 << 30
# Side files transformers reads beside tokenizer.json, each bounded before it does (a FIFO would block its
# open().read(), a 10 GB template would be read whole). Real ones: Llama 3's tokenizer_config.json is 50 KB,
# chat templates a few KB.
MAX_TEMPLATE_BYTES = 1 << 20
MAX_SIDE_JSON_BYTES = 16 << 20
JSON_SIDE_FILES = (CONFIG_FILE, "special_tokens_map.json", "added_tokens.json")
TEMPLATE_FILES = ("chat_template.jinja",)
TEMPLATE_DIR, MAX_EXTRA_TEMPLATES = "additional_chat_templates", 64


def check_side_files(d: Path) -> None:
    """Every tokenizer side file present in ``d`` read once within its bound (size, depth, UTF-8, a regular
    file), so that transformers' own unbounded reads that follow see only files that passed."""
    for name in JSON_SIDE_FILES:
        if (d / name).exists():
            read_json_object(d / name, what=name, max_bytes=MAX_SIDE_JSON_BYTES, error=ConfigError)
    extra = d / TEMPLATE_DIR
    templates = [d / n for n in TEMPLATE_FILES if (d / n).exists()]
    if extra.is_dir():
        found = sorted(extra.iterdir())
        if len(found) > MAX_EXTRA_TEMPLATES:
            raise ConfigError(f"{extra}: {len(found):,} files, more than the {MAX_EXTRA_TEMPLATES} named chat templates "
                              "port reads; keep the model's own templates only")
        templates += [f for f in found if f.suffix == ".jinja"]
    for f in templates:
        read_text(f, what="chat template", max_bytes=MAX_TEMPLATE_BYTES, error=ConfigError)


def _tokenizer_source(d: Path) -> Path:
    """The file the tokenizer will be built from; one line naming what is missing otherwise."""
    if not d.is_dir():
        raise ConfigError(f"{d}: no such model directory; expected a directory holding {TOKENIZER_FILE}")
    if (d / TOKENIZER_FILE).is_file():
        return d / TOKENIZER_FILE
    if (d / SENTENCEPIECE_FILE).is_file():
        if importlib.util.find_spec("sentencepiece") is None:
            raise ConfigError(f"{d}: missing {TOKENIZER_FILE}, and reading {SENTENCEPIECE_FILE} needs the "
                              f"sentencepiece package; pip install sentencepiece, or save the model's "
                              f"{TOKENIZER_FILE} beside it")
        return d / SENTENCEPIECE_FILE
    raise ConfigError(f"{d}: missing {TOKENIZER_FILE} (or {SENTENCEPIECE_FILE}); copy the model's tokenizer files "
                      "into the model directory")


def _explain_failure(d: Path, source: Path, exc: Exception) -> ConfigError:
    """The one-line reason a present tokenizer did not load: a bad JSON file by name when one is, else
    the library's first line."""
    for name in (CONFIG_FILE, TOKENIZER_FILE):
        if (d / name).is_file():
            try:
                read_json_object(d / name, what=name, error=ConfigError)
            except ConfigError as bad:
                return bad
    first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return ConfigError(f"{source}: cannot build the tokenizer ({first}); re-save the model's tokenizer files "
                       f"({TOKENIZER_FILE}, {CONFIG_FILE}) into {d}")


def load_tokenizer(model_dir: str | Path) -> PreTrainedTokenizerBase:
    """The HF tokenizer of ``model_dir``, from local files only, with no length limit of its own."""
    d = Path(model_dir)
    source = _tokenizer_source(d)
    size = source.stat().st_size
    if size > MAX_JSON_BYTES or not source.is_file():
        raise ConfigError(f"{source}: {size:,} bytes, more than the {MAX_JSON_BYTES:,} a tokenizer file may have "
                          "(or not a regular file); this is not a tokenizer port can read")
    check_side_files(d)
    from transformers import AutoTokenizer

    try:
        tok = AutoTokenizer.from_pretrained(str(d), local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError, ... depending on the file
        raise _explain_failure(d, source, exc) from None
    tok.model_max_length = UNBOUNDED_LENGTH
    return tok
