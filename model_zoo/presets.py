"""Named sizes of the Llama family, as data, and the user's own named models.

Each built-in entry holds the fields of the model's HF ``config.json`` that the builder needs, and the
HF repo it came from (the comment names the file). Nothing here is fetched: ``port convert --hf NAME``
looks the repo up in the local HF cache.

Users add names of their own with ``port zoo add NAME --hf DIR|REPO``: each is the checkpoint's
``config.json`` (validated) and where the checkpoint is, kept in one JSON file, the *user registry*
(``$PORT_ZOO_FILE``, else ``$XDG_CONFIG_HOME/port/zoo.json``, else ``~/.config/port/zoo.json``).
:func:`names`, :func:`get` and :func:`config` see built-in and user entries alike, so every command
taking a zoo name resolves them.
"""

from __future__ import annotations

import contextlib
import difflib
import json
import os
import re
import time
from pathlib import Path

from model_zoo.config import LlamaConfig
from model_zoo.errors import ConfigError, UnknownModelError

ASSETS = Path(__file__).parent / "assets"
EMBEDDED_DEFAULT = "stories260k"

_LLAMA1 = dict(model_type="llama", vocab_size=32000, hidden_size=4096, intermediate_size=11008,
               num_hidden_layers=32, num_attention_heads=32, num_key_value_heads=32,
               max_position_embeddings=2048, rms_norm_eps=1e-6, rope_theta=10000.0,
               bos_token_id=1, eos_token_id=2)

PRESETS: list[dict] = [
    # model_zoo/assets/stories260k/config.json (karpathy/tinyllamas stories260K, MIT; embedded)
    dict(name="stories260k", hf_repo=None, path=str(ASSETS / "stories260k"),
         config=dict(model_type="llama", vocab_size=512, hidden_size=64, intermediate_size=172,
                     num_hidden_layers=5, num_attention_heads=8, num_key_value_heads=4,
                     max_position_embeddings=512, rms_norm_eps=1e-5, rope_theta=10000.0,
                     tie_word_embeddings=True, bos_token_id=1, eos_token_id=2),
         # Greedy continuation of BOS measured with HF transformers on CPU in fp32 (shared/README.md).
         golden=dict(prompt_ids=[1], new_tokens=60,
                     text="Once upon a time, there was a little girl named Lily. She loved to play outside "
                          "in the park. One day, she saw a big, red ball. She wanted to play with it, but it "
                          "was too high"),
         # sha256 of the embedded files: the copy of shared/data/models/stories260k the golden facts belong to
         sha256={"config.json": "14ba45c0cdd03e5d10ff6679004259ba127047e562103fc491c722513f68f472",
                 "model.safetensors": "407a7c581bdd66972383ce9ad24857713fb98786d06ea564a2fe9b34ebe77dfd",
                 "tokenizer.json": "30d602c71f8ad3f7747c0c330dff21e6506a119b63994bd20998fbc0ae9ffb0a",
                 "tokenizer.model": "bf8e929680b960de8754465bb222aab0de883a668601245a7218914c6451370f",
                 "tokenizer_config.json": "7043e163c3f1c6681ceb1113e2ed13f5e574e9243cb112cb1e6ec4b285a5bbc3"}),
    # huggyllama/llama-7b config.json
    dict(name="llama-7b", hf_repo="huggyllama/llama-7b", config=dict(_LLAMA1)),
    # huggyllama/llama-13b config.json
    dict(name="llama-13b", hf_repo="huggyllama/llama-13b",
         config=dict(_LLAMA1, hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                     num_attention_heads=40, num_key_value_heads=40)),
    # meta-llama/Llama-2-7b-hf config.json
    dict(name="llama2-7b", hf_repo="meta-llama/Llama-2-7b-hf",
         config=dict(_LLAMA1, max_position_embeddings=4096, rms_norm_eps=1e-5)),
    # meta-llama/Llama-2-13b-hf config.json
    dict(name="llama2-13b", hf_repo="meta-llama/Llama-2-13b-hf",
         config=dict(_LLAMA1, hidden_size=5120, intermediate_size=13824, num_hidden_layers=40,
                     num_attention_heads=40, num_key_value_heads=40, max_position_embeddings=4096,
                     rms_norm_eps=1e-5)),
    # codellama/CodeLlama-7b-hf config.json
    dict(name="codellama-7b", hf_repo="codellama/CodeLlama-7b-hf",
         config=dict(_LLAMA1, vocab_size=32016, max_position_embeddings=16384, rms_norm_eps=1e-5,
                     rope_theta=1000000.0)),
    # meta-llama/Meta-Llama-3-8B config.json
    dict(name="llama3-8b", hf_repo="meta-llama/Meta-Llama-3-8B",
         config=dict(_LLAMA1, vocab_size=128256, intermediate_size=14336, num_key_value_heads=8,
                     max_position_embeddings=8192, rms_norm_eps=1e-5, rope_theta=500000.0,
                     bos_token_id=128000, eos_token_id=128001)),
    # meta-llama/Llama-3.1-8B config.json
    dict(name="llama3.1-8b", hf_repo="meta-llama/Llama-3.1-8B",
         config=dict(_LLAMA1, vocab_size=128256, intermediate_size=14336, num_key_value_heads=8,
                     max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                     rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                       high_freq_factor=4.0, original_max_position_embeddings=8192),
                     bos_token_id=128000, eos_token_id=128001)),
    # TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T config.json
    dict(name="tinyllama-1.1b", hf_repo="TinyLlama/TinyLlama-1.1B-intermediate-step-1431k-3T",
         config=dict(_LLAMA1, hidden_size=2048, intermediate_size=5632, num_hidden_layers=22,
                     num_attention_heads=32, num_key_value_heads=4, rms_norm_eps=1e-5)),
    # mistralai/Mistral-7B-v0.1 config.json
    dict(name="mistral-7b", hf_repo="mistralai/Mistral-7B-v0.1",
         config=dict(_LLAMA1, model_type="mistral", intermediate_size=14336, num_key_value_heads=8,
                     max_position_embeddings=32768, rms_norm_eps=1e-5, sliding_window=4096)),
    # Qwen/Qwen2-7B config.json (q/k/v bias, no o bias; use_sliding_window false)
    dict(name="qwen2-7b", hf_repo="Qwen/Qwen2-7B",
         config=dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                     num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                     max_position_embeddings=131072, rms_norm_eps=1e-6, rope_theta=1000000.0,
                     qkv_bias=True, bos_token_id=151643, eos_token_id=151643)),
    # meta-llama/Llama-3.2-1B config.json (tied embeddings, llama3 RoPE factor 32)
    dict(name="llama3.2-1b", hf_repo="meta-llama/Llama-3.2-1B",
         config=dict(_LLAMA1, vocab_size=128256, hidden_size=2048, intermediate_size=8192, num_hidden_layers=16,
                     num_attention_heads=32, num_key_value_heads=8, max_position_embeddings=131072,
                     rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
                     rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                       high_freq_factor=4.0, original_max_position_embeddings=8192),
                     bos_token_id=128000, eos_token_id=128001)),
    # meta-llama/Llama-3.2-3B config.json
    dict(name="llama3.2-3b", hf_repo="meta-llama/Llama-3.2-3B",
         config=dict(_LLAMA1, vocab_size=128256, hidden_size=3072, intermediate_size=8192, num_hidden_layers=28,
                     num_attention_heads=24, num_key_value_heads=8, max_position_embeddings=131072,
                     rms_norm_eps=1e-5, rope_theta=500000.0, tie_word_embeddings=True,
                     rope_scaling=dict(rope_type="llama3", factor=32.0, low_freq_factor=1.0,
                                       high_freq_factor=4.0, original_max_position_embeddings=8192),
                     bos_token_id=128000, eos_token_id=128001)),
    # Qwen/Qwen2.5-7B config.json (q/k/v bias; use_sliding_window false)
    dict(name="qwen2.5-7b", hf_repo="Qwen/Qwen2.5-7B",
         config=dict(model_type="qwen2", vocab_size=152064, hidden_size=3584, intermediate_size=18944,
                     num_hidden_layers=28, num_attention_heads=28, num_key_value_heads=4,
                     max_position_embeddings=131072, rms_norm_eps=1e-6, rope_theta=1000000.0,
                     qkv_bias=True, bos_token_id=151643, eos_token_id=151643)),
    # Qwen/Qwen2.5-14B config.json
    dict(name="qwen2.5-14b", hf_repo="Qwen/Qwen2.5-14B",
         config=dict(model_type="qwen2", vocab_size=152064, hidden_size=5120, intermediate_size=13824,
                     num_hidden_layers=48, num_attention_heads=40, num_key_value_heads=8,
                     max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=1000000.0,
                     qkv_bias=True, bos_token_id=151643, eos_token_id=151643)),
    # deepseek-ai/DeepSeek-R1-Distill-Llama-8B config.json (Llama-3.1-8B architecture)
    dict(name="deepseek-r1-distill-llama-8b", hf_repo="deepseek-ai/DeepSeek-R1-Distill-Llama-8B",
         config=dict(_LLAMA1, vocab_size=128256, intermediate_size=14336, num_key_value_heads=8,
                     max_position_embeddings=131072, rms_norm_eps=1e-5, rope_theta=500000.0,
                     rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                                       high_freq_factor=4.0, original_max_position_embeddings=8192),
                     bos_token_id=128000, eos_token_id=128001)),
]

# The released Qwen3 dense sizes: Qwen/Qwen3-{0.6B,1.7B,4B,8B,14B,32B} config.json (transformers 4.51.0;
# model_type qwen3, head_dim 128, attention_bias false, rope_theta 1e6, max_position_embeddings 40960,
# rms_norm_eps 1e-6, vocab 151936, bos 151643 <|endoftext|>, eos 151645 <|im_end|>, use_sliding_window false).
_QWEN3 = dict(model_type="qwen3", vocab_size=151936, head_dim=128, num_key_value_heads=8, qk_norm=True,
              max_position_embeddings=40960, rms_norm_eps=1e-6, rope_theta=1000000.0,
              bos_token_id=151643, eos_token_id=151645)


def _qwen3(size: str, hidden: int, inter: int, layers: int, heads: int, tied: bool) -> dict:
    return dict(name=f"qwen3-{size.lower()}", hf_repo=f"Qwen/Qwen3-{size}",
                config=dict(_QWEN3, hidden_size=hidden, intermediate_size=inter, num_hidden_layers=layers,
                            num_attention_heads=heads, tie_word_embeddings=tied))


PRESETS += [
    _qwen3("0.6B", 1024, 3072, 28, 16, True),     # Qwen/Qwen3-0.6B config.json
    _qwen3("1.7B", 2048, 6144, 28, 16, True),     # Qwen/Qwen3-1.7B config.json
    _qwen3("4B", 2560, 9728, 36, 32, True),       # Qwen/Qwen3-4B config.json
    _qwen3("8B", 4096, 12288, 36, 32, False),     # Qwen/Qwen3-8B config.json
    _qwen3("14B", 5120, 17408, 40, 40, False),    # Qwen/Qwen3-14B config.json
    _qwen3("32B", 5120, 25600, 64, 64, False),    # Qwen/Qwen3-32B config.json (q_size 8192 > hidden 5120)
]

_BY_NAME = {p["name"]: p for p in PRESETS}
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


# --------------------------------------------------------------------------- the user registry
# The registry is one small JSON document that several `port zoo add` may change at once. Every change
# is a read-modify-write under an exclusive lock on a sibling ``.lock`` file (port creates it), written
# atomically, and keeps what it does not know: top-level keys other than "models" and unknown keys of
# entries survive. It is bounded on write as on read, so no sequence of `zoo add` can make a registry
# that port itself refuses to read.
MAX_REGISTRY_BYTES = 8 << 20      # thousands of real config.json entries (a few KB each)
LOCK_WAIT_S = 30.0


def user_registry_path() -> Path:
    """Where ``port zoo add`` keeps the user's names (``$PORT_ZOO_FILE`` overrides)."""
    if os.environ.get("PORT_ZOO_FILE"):
        return Path(os.environ["PORT_ZOO_FILE"]).expanduser()
    base = os.environ.get("XDG_CONFIG_HOME") or os.path.join(os.path.expanduser("~"), ".config")
    return Path(base) / "port" / "zoo.json"


def _read_registry(path: Path) -> dict:
    """The whole registry document (``{"models": []}`` when the file does not exist), checked."""
    from model_zoo.files import read_json_object

    if not path.exists():
        return {"models": []}
    doc = read_json_object(path, what="zoo registry (PORT_ZOO_FILE)", max_bytes=MAX_REGISTRY_BYTES,
                           error=ConfigError)
    models = doc.get("models")
    if not isinstance(models, list) or not all(isinstance(m, dict) and isinstance(m.get("name"), str)
                                               and isinstance(m.get("hf_config"), dict) for m in models):
        raise ConfigError(f"{path}: expected {{\"models\": [{{\"name\", \"hf_config\", ...}}]}} as `port zoo add` "
                          "writes it; fix the file or remove it (built-in names work meanwhile)")
    return doc


def user_entries() -> list[dict]:
    """The user registry's entries (none when the file does not exist)."""
    return [dict(m, user=True) for m in _read_registry(user_registry_path())["models"]]


@contextlib.contextmanager
def _locked(path: Path):
    """An exclusive lock on ``path``'s sibling ``.lock`` file, waited for at most ``LOCK_WAIT_S``."""
    import fcntl

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.with_name(path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o644)
    except OSError as e:
        raise ConfigError(f"{path}: cannot create the zoo registry's directory or lock file ({e.filename}: "
                          f"{e.strerror}); set PORT_ZOO_FILE to a writable place") from None
    try:
        deadline = time.monotonic() + LOCK_WAIT_S
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() > deadline:
                    raise ConfigError(f"{path}: another `port zoo` has held the registry's lock for "
                                      f"{LOCK_WAIT_S:.0f} s; wait for it to finish and try again") from None
                time.sleep(0.02)
        yield
    finally:
        os.close(fd)   # closing the descriptor releases the lock


def _change_user(change) -> Path:
    """Apply ``change(models) -> models`` to the registry under its lock, keeping unknown keys; the
    new document is refused (nothing written) when it would pass ``MAX_REGISTRY_BYTES``."""
    from model_zoo.files import write_atomic

    path = user_registry_path()
    with _locked(path):
        doc = _read_registry(path)
        doc["models"] = change(doc["models"])
        text = json.dumps(doc, indent=1) + "\n"
        if len(text.encode("utf-8")) > MAX_REGISTRY_BYTES:
            raise ConfigError(f"{path}: the zoo registry would grow to {len(text.encode()):,} bytes, more than the "
                              f"{MAX_REGISTRY_BYTES:,} port reads back; remove entries (port zoo remove NAME) first")
        write_atomic(path, text, error=ConfigError)
    return path


def add_user(name: str, hf_config: dict, *, path: str | None, hf_repo: str | None, replace: bool = False) -> dict:
    """Record ``hf_config`` (a checkpoint's config.json, validated here) under ``name``."""
    if not NAME_RE.match(name):
        raise ConfigError(f"zoo name {name!r}: expected letters, digits, '.', '_' or '-' (at most 64, no '/'), "
                          "e.g. my-llama-7b")
    if name in _BY_NAME:
        raise ConfigError(f"zoo name {name!r} is a built-in size; choose another name")
    LlamaConfig.from_hf(hf_config)   # refuses an unsupported or broken config.json with its reasons
    entry = {"name": name, "hf_repo": hf_repo, "path": path, "hf_config": hf_config}

    def change(models: list[dict]) -> list[dict]:
        if any(m["name"] == name for m in models) and not replace:
            raise ConfigError(f"zoo name {name!r} is already in {user_registry_path()}; pass --replace to "
                              f"overwrite it or `port zoo remove {name}` first")
        return [m for m in models if m["name"] != name] + [entry]
    _change_user(change)
    return dict(entry, user=True)


def remove_user(name: str) -> Path:
    def change(models: list[dict]) -> list[dict]:
        if name not in [m["name"] for m in models]:
            hint = " (a built-in size; those cannot be removed)" if name in _BY_NAME else ""
            raise UnknownModelError(f"zoo name {name!r} is not in the user registry {user_registry_path()}{hint}; "
                                    "see `port zoo list`")
        return [m for m in models if m["name"] != name]
    return _change_user(change)


# --------------------------------------------------------------------------- lookups
def all_entries() -> list[dict]:
    return PRESETS + user_entries()


def names() -> list[str]:
    return [p["name"] for p in all_entries()]


def builtin(name: str) -> bool:
    """A built-in size: known without reading the user registry, so a broken registry never disables it."""
    return name in _BY_NAME


def known(name: str) -> bool:
    """A built-in or user name (the registry is read only for names that are not built in)."""
    return builtin(name) or name in [e["name"] for e in user_entries()]


def by_hf_repo(repo: str) -> str | None:
    """The built-in name whose HF repo is ``repo`` (case-insensitive, as the Hub matches ids), or None."""
    want = str(repo).strip().lower()
    return next((p["name"] for p in PRESETS if p.get("hf_repo") and p["hf_repo"].lower() == want), None)


# Name parts that mark a variant of a released base rather than another architecture (HF Hub naming: Llama-2's
# "-chat-hf", Llama-3's and Qwen's "-Instruct", Qwen3's "-Base", Gemma-style "-it", fine-tunes' "-SFT"/"-DPO").
VARIANT_PARTS = {"instruct", "chat", "hf", "base", "it", "sft", "dpo", "rlhf"}


def _stem(repo: str) -> tuple[str, ...]:
    """A repo id's model name without its organisation, "Meta-" and the variant parts, lowercased."""
    parts = [x for x in str(repo).strip().lower().rpartition("/")[2].replace("_", "-").split("-") if x]
    if parts and parts[0] == "meta":
        parts = parts[1:]
    return tuple(x for i, x in enumerate(parts) if i == 0 or x not in VARIANT_PARTS)


def variant_of(repo: str) -> str | None:
    """The built-in name whose HF repo ``repo`` is a variant of (an instruct or chat model, a base and its
    fine-tunes, under any organisation: ``meta-llama/Meta-Llama-3-8B-Instruct`` -> llama3-8b), or None. Only one
    match counts; the variant's own config.json may differ from the base's (its vocabulary, RoPE, window)."""
    want = _stem(repo)
    hits = {p["name"] for p in PRESETS if p.get("hf_repo") and len(want) > 1 and _stem(p["hf_repo"]) == want}
    return hits.pop() if len(hits) == 1 else None


def get(name: str) -> dict:
    """The entry for ``name`` (built-in or user); unknown names get the nearest names suggested."""
    if name in _BY_NAME:
        return _BY_NAME[name]
    user = {e["name"]: e for e in user_entries()}
    if name not in user:
        near = difflib.get_close_matches(name, names(), n=3, cutoff=0.4)
        hint = f"; did you mean {', '.join(near)}?" if near else ""
        raise UnknownModelError(f"unknown zoo model {name!r}{hint} Known: {', '.join(names())} "
                                "(see `port zoo list`; add your own with `port zoo add NAME --hf DIR`)")
    return user[name]


def config(name: str) -> LlamaConfig:
    entry = get(name)
    if "hf_config" in entry:
        return LlamaConfig.from_hf(entry["hf_config"])
    return LlamaConfig(**entry["config"])


def embedded_default_dir() -> Path:
    """The stories260K checkpoint shipped inside the package (MIT, karpathy/tinyllamas)."""
    return Path(get(EMBEDDED_DEFAULT)["path"])
