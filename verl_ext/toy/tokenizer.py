"""Byte-level BPE tokenizer for the toy task (no merges, ChatML specials).

Vocabulary: the 256 ByteLevel alphabet characters with id == byte value, then
``<|endoftext|>``, ``<|im_start|>``, ``<|im_end|>`` (eos) and ``<pad>`` (pad).
The pre-tokenizer/normalizer/decoder mirror transformers' ``Qwen2Tokenizer``, so
``AutoTokenizer`` (which re-wraps the files as ``Qwen2Tokenizer`` for
``model_type=qwen2``) behaves exactly like the saved ``tokenizer.json``:
whitespace and newlines round-trip and ``"\\n"`` is one token (verl's
``QwenContinuousTokenBuilder`` requires that).
"""

from __future__ import annotations

import os

ENDOFTEXT = "<|endoftext|>"
IM_START = "<|im_start|>"
IM_END = "<|im_end|>"
PAD = "<pad>"
SPECIAL_TOKENS = (ENDOFTEXT, IM_START, IM_END, PAD)
VOCAB_SIZE = 256 + len(SPECIAL_TOKENS)  # len(build_tokenizer()): the byte alphabet, then the specials

# Same split regex as transformers' Qwen2Tokenizer.
_QWEN_PRETOKENIZE_REGEX = (
    r"""(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+"""
)

CHAT_TEMPLATE = (
    "{% for message in messages %}"
    "{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"
)


def _byte_alphabet() -> list[str]:
    """The 256 ByteLevel characters, index == byte value (GPT-2 bytes_to_unicode)."""
    from tokenizers import pre_tokenizers

    # alphabet() is a set; rebuild the byte -> char mapping explicitly so ids are stable.
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    cs = bs[:]
    n = 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    mapping = dict(zip(bs, cs))
    chars = [chr(mapping[b]) for b in range(256)]
    assert set(chars) == set(pre_tokenizers.ByteLevel.alphabet())
    return chars


def build_tokenizer():
    """Return a ``PreTrainedTokenizerFast`` (not yet saved)."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, normalizers, pre_tokenizers
    from tokenizers.models import BPE
    from transformers import PreTrainedTokenizerFast

    vocab = {ch: i for i, ch in enumerate(_byte_alphabet())}
    tok = Tokenizer(
        BPE(
            vocab=vocab,
            merges=[],
            dropout=None,
            unk_token=None,
            continuing_subword_prefix="",
            end_of_word_suffix="",
            fuse_unk=False,
            byte_fallback=False,
        )
    )
    tok.normalizer = normalizers.NFC()
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [
            pre_tokenizers.Split(Regex(_QWEN_PRETOKENIZE_REGEX), behavior="isolated", invert=False),
            pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
        ]
    )
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False) for t in SPECIAL_TOKENS])

    hf = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,
        pad_token=PAD,
        unk_token=None,
        bos_token=None,
        padding_side="left",
        model_max_length=512,
        clean_up_tokenization_spaces=False,
    )
    hf.chat_template = CHAT_TEMPLATE
    return hf


def save_tokenizer(out_dir: str | os.PathLike):
    """Build and save the tokenizer (tokenizer.json + tokenizer_config.json) into ``out_dir``."""
    import json

    hf = build_tokenizer()
    hf.save_pretrained(str(out_dir))
    # Make the class explicit so every loader agrees (AutoTokenizer would pick it anyway for qwen2).
    cfg_path = os.path.join(str(out_dir), "tokenizer_config.json")
    with open(cfg_path) as f:
        cfg = json.load(f)
    cfg["tokenizer_class"] = "Qwen2Tokenizer"
    cfg["padding_side"] = "left"
    cfg["chat_template"] = CHAT_TEMPLATE
    cfg["eos_token"] = IM_END
    cfg["pad_token"] = PAD
    cfg["unk_token"] = None
    cfg["bos_token"] = None
    cfg["add_prefix_space"] = False
    cfg["clean_up_tokenization_spaces"] = False
    with open(cfg_path, "w") as f:
        json.dump(cfg, f, indent=2, ensure_ascii=False)
    return hf
