"""Prompt text made to a length in tokens, the same for the same key: what a replayed trace or a
prefix-cache workload sends in place of prompts it does not have.

Lengths are exact on the simulator's tokenizer (a token per four characters, as
``sim.server.count_tokens`` counts); there are 0.9 words per four characters, and a real
tokenizer makes one token of each of these common English words, so about 0.9 of the length.
Text for a key begins with the key itself, so two keys' texts differ from their first
characters and a prefix cache never mistakes one for the other; the rest is a stretch of seeded
random words chosen by the key, so the same seed, salt and key give the same text in every run
and process, and a shorter text is a prefix of a longer one.
"""

from __future__ import annotations

import hashlib

import numpy as np

from ..records import CHARS_PER_TOKEN
from .datasets import WORDS

_POOL_WORDS = 16_384  # ~75 kB of words, drawn once: a text is a slice of it, not a fresh draw


class PromptText:
    """Deterministic text of exact token lengths from ``seed``; ``salt`` makes every text of
    this instance differ from every text of an unsalted (or differently salted) one."""

    def __init__(self, seed: int, salt: str | None = None) -> None:
        self.seed = seed
        self.salt = salt
        words = np.random.default_rng(seed).choice(np.array(WORDS), _POOL_WORDS)
        self._pool = " ".join(words.tolist()) + " "

    def text(self, key: str, tokens: int) -> str:
        """``tokens`` tokens of text that starts with ``key`` (cut short if it is longer)."""
        chars = tokens * CHARS_PER_TOKEN
        head = f"[{key}@{self.salt}] " if self.salt else f"[{key}] "
        digest = hashlib.blake2b(f"{self.seed}/{self.salt}/{key}".encode(), digest_size=8).digest()
        pool = self._pool
        start = pool.find(" ", int.from_bytes(digest) % len(pool)) + 1  # at a word (0 past the end)
        parts, have = [head], len(head)
        while have < chars:  # the pool read round and round from the key's place in it
            piece = pool[start : start + chars - have]
            parts.append(piece)
            have += len(piece)
            start = 0
        return "".join(parts)[:chars]

    def blocks(self, ids: tuple[int, ...], block_tokens: int, tokens: int, tail_key: str) -> str:
        """A prompt of ``tokens`` tokens made of shared blocks, ``block_tokens`` each, one per id
        (equal ids, equal text), as many as fit, then text of its own (``tail_key``) for any
        tokens the blocks do not cover. The last block is cut to what is left of ``tokens``."""
        parts, left = [], tokens
        for block in ids:
            if left <= 0:
                break
            take = min(block_tokens, left)
            parts.append(self.text(f"b{block}", block_tokens)[: take * CHARS_PER_TOKEN])
            left -= take
        if left > 0:
            parts.append(self.text(tail_key, left))
        return "".join(parts)
