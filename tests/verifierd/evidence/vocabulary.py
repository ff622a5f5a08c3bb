"""The tiny model's byte-level vocabulary, sorted into the kinds of ids that make
text fail to tokenize back (shared by the search's and the spelling's tests)."""

from __future__ import annotations

from functools import cache

from verifierd.evidence.vllm_views import ByteLevelText


class Vocabulary:
    def __init__(self, path: str) -> None:
        from vllm.tokenizers import get_tokenizer

        self.tokenizer = get_tokenizer(path)
        self.width = len(self.tokenizer) + 16  # padding rows, as the tiny model has
        self.text = ByteLevelText(self.tokenizer, self.width, skip_special_tokens=True)
        table = self.text.token_bytes
        self.words = [i for i, b in enumerate(table) if len(b) > 1 and b.isascii()]
        self.high_bytes = [self.text.byte_tokens(bytes([b]))[0] for b in range(0x80, 0x100)]
        self.invisible = [*self.tokenizer.added_tokens_decoder, len(self.tokenizer) + 3]
        self.eos = int(self.tokenizer.eos_token_id)


@cache
def vocabulary(path: str) -> Vocabulary:
    return Vocabulary(path)
