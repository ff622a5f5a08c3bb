"""The commitments' tokenizers, loaded from the weights cache for the record view.

Only a ``tokenizer.json`` whose SHA-256 matches the commitment is used, so the
texts shown beside the margins come from exactly the committed tokenizer.
Tokenizers are loaded once per commitment and kept (they are small).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Sequence
from dataclasses import dataclass

from tokenizers import Tokenizer

from verifierd.commitments import Commitment, sha256_file
from verifierd.weights_cache import WeightsCache

log = logging.getLogger(__name__)

TOKENIZER_FILE = "tokenizer.json"


@dataclass(frozen=True)
class LoadedTokenizer:
    """A committed tokenizer (the record view's TokenCodec)."""

    tokenizer: Tokenizer

    def encode_text(self, text: str) -> list[int]:
        return list(self.tokenizer.encode(text, add_special_tokens=False).ids)

    def decode_ids(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=False))


@dataclass(frozen=True)
class TokenizerLookup:
    codec: LoadedTokenizer | None
    #: Why codec is None ("" when it is loaded).
    note: str


class TokenizerCache:
    """Thread-safe; looks a commitment's tokenizer up once and remembers the outcome
    (a missing file is looked for again on the next call, as it may be installed)."""

    def __init__(self, weights: WeightsCache | None) -> None:
        self._weights = weights
        self._loaded: dict[str, LoadedTokenizer] = {}
        self._lock = threading.Lock()

    def lookup(self, commitment: Commitment) -> TokenizerLookup:
        with self._lock:
            found = self._loaded.get(commitment.commitment_id)
        if found is not None:
            return TokenizerLookup(found, "")
        committed = {f.path: f.sha256 for f in commitment.files}.get(TOKENIZER_FILE)
        if committed is None:
            return TokenizerLookup(None, f"the commitment has no {TOKENIZER_FILE}")
        if self._weights is None:
            return TokenizerLookup(None, "this verifierd has no weights cache configured")
        path = self._weights.path_for(commitment) / TOKENIZER_FILE
        if not path.is_file():
            return TokenizerLookup(None, f"the commitment's {TOKENIZER_FILE} is not cached")
        if sha256_file(path) != committed:
            log.warning("cached tokenizer differs from its commitment", extra={"path": str(path)})
            return TokenizerLookup(None, f"the cached {TOKENIZER_FILE} does not match")
        try:
            loaded = LoadedTokenizer(Tokenizer.from_file(str(path)))
        except Exception as exc:  # tokenizers raises bare Exception on a bad file
            return TokenizerLookup(None, f"{TOKENIZER_FILE} does not load: {exc}")
        with self._lock:
            self._loaded[commitment.commitment_id] = loaded
        return TokenizerLookup(loaded, "")
