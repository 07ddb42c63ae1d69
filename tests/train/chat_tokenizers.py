"""Offline stand-ins for the Llama 3, Qwen2 and Mistral tokenizers, built with `tokenizers`.

The model tokenizers themselves are large downloads; what masking depends on is their *kind*
(byte-level BPE with the template's special tokens as added tokens for Llama 3 and Qwen2;
SentencePiece-style BPE with "▁" spaces and byte fallback for Mistral) and the real chat template
string (tests/train/fixtures/chat_templates.json). The vocabularies are trained here on the real
fixture texts, so merges do cross word and template boundaries as in the real ones.
"""

from __future__ import annotations

import json
from pathlib import Path

FIXTURES = Path(__file__).parent / "fixtures"


def templates() -> dict:
    return json.loads((FIXTURES / "chat_templates.json").read_text())


def _corpus() -> list[str]:
    texts = []
    for f in sorted(FIXTURES.glob("*.json*")):
        if f.name == "chat_templates.json":
            continue
        texts.append(f.read_text())
    # Template text the tokenizer will see, so that merges across its edges exist.
    texts += ["[INST] Hello [/INST]Hi there</s> [INST] Who are you [/INST]", "system\nuser\nassistant\n"] * 20
    return texts


def build(name: str):
    """A transformers fast tokenizer of the kind ``name`` uses, carrying its real chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    spec = templates()[name]
    special = spec["special_tokens"]
    if spec["style"] == "bytelevel":
        tk = Tokenizer(models.BPE())
        tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tk.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=800, special_tokens=special,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:
        tk = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
        tk.pre_tokenizer = pre_tokenizers.Metaspace(replacement="▁", prepend_scheme="first", split=False)
        tk.decoder = decoders.Sequence([decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(),
                                        decoders.Strip(" ", 1, 0)])
        trainer = trainers.BpeTrainer(vocab_size=800, special_tokens=special + [f"<0x{i:02X}>" for i in range(256)],
                                      max_token_length=12)
    tk.train_from_iterator(_corpus(), trainer)
    return PreTrainedTokenizerFast(tokenizer_object=tk, bos_token=spec["bos_token"], eos_token=spec["eos_token"],
                                   additional_special_tokens=[t for t in special
                                                              if t not in (spec["bos_token"], spec["eos_token"])],
                                   chat_template=spec["template"])
