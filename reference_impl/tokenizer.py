"""A small fast tokenizer with Nano-Nemotron VL's special tokens, built in code (no model hub).

Byte-level BPE without merges: every byte is one token, so token counts of text are predictable
(``len(text.encode())``), and the special tokens are single added tokens. It is a real
``tokenizers.Tokenizer`` wrapped in ``transformers.PreTrainedTokenizerFast``: the same Rust object
that vLLM shares between threads.
"""

from __future__ import annotations

from functools import lru_cache

from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import PreTrainedTokenizerFast

IMG_START = "<img>"
IMG_END = "</img>"
IMG_CONTEXT = "<image>"
VIDEO_PLACEHOLDER = "<video>"
AUDIO_START = "<so_start>"
AUDIO_END = "<so_end>"
AUDIO_CONTEXT = "<so_embedding>"

SPECIAL_TOKENS: tuple[str, ...] = (
    "<unk>",
    "<s>",
    "</s>",
    IMG_START,
    IMG_END,
    IMG_CONTEXT,
    VIDEO_PLACEHOLDER,
    AUDIO_START,
    AUDIO_END,
    AUDIO_CONTEXT,
)
NUM_BYTE_TOKENS = 256
VOCAB_SIZE = NUM_BYTE_TOKENS + len(SPECIAL_TOKENS)


def build_tokenizer_object() -> Tokenizer:
    """The raw ``tokenizers.Tokenizer``: 256 byte tokens, then the special tokens."""
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    vocab = {symbol: i for i, symbol in enumerate(sorted(alphabet))}
    assert len(vocab) == NUM_BYTE_TOKENS
    tokenizer = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
    tokenizer.decoder = decoders.ByteLevel()
    tokenizer.add_special_tokens(list(SPECIAL_TOKENS))
    return tokenizer


def build_tokenizer() -> PreTrainedTokenizerFast:
    """A fresh fast tokenizer (each call builds a new Rust object)."""
    return PreTrainedTokenizerFast(
        tokenizer_object=build_tokenizer_object(),
        unk_token="<unk>",
        bos_token="<s>",
        eos_token="</s>",
    )


@lru_cache(maxsize=1)
def shared_tokenizer() -> PreTrainedTokenizerFast:
    """One tokenizer per process, shared the way a serving engine shares it."""
    return build_tokenizer()
