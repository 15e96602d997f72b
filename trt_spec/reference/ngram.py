"""Prompt-lookup (n-gram) drafting: propose the continuation of an earlier occurrence of the latest n-gram."""

from __future__ import annotations

from collections.abc import Collection, Sequence

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view


class NgramDraft:
    """Match the last n tokens (n = max_ngram, ..., min_ngram) against earlier prompt + output tokens and
    propose up to k tokens that followed the most recent match. Costs no model call."""

    def __init__(self, max_ngram: int = 3, k: int = 4, *, min_ngram: int = 1):
        if min_ngram < 1:
            raise ValueError(f"min_ngram must be >= 1, got {min_ngram}")
        if max_ngram < min_ngram:
            raise ValueError(f"max_ngram must be >= min_ngram ({min_ngram}), got {max_ngram}")
        if k < 0:
            raise ValueError(f"k must be >= 0, got {k}")
        self.max_ngram = max_ngram
        self.min_ngram = min_ngram
        self.k = k

    def __repr__(self) -> str:
        return f"NgramDraft(max_ngram={self.max_ngram}, k={self.k}, min_ngram={self.min_ngram})"

    def propose(self, tokens: Sequence[int], k: int | None = None, eos_token_ids: Collection[int] = ()) -> list[int]:
        """Up to k (default self.k) proposed tokens, [] when no n-gram matches.

        The proposal ends at the first EOS it contains (EOS included): nothing past an EOS is proposed.
        """
        k = self.k if k is None else k
        seq = np.asarray(tokens, dtype=np.int64)
        L = len(seq)
        if k <= 0 or L < 2:
            return []
        for n in range(min(self.max_ngram, L - 1), self.min_ngram - 1, -1):
            # Windows starting at 0 .. L-1-n: each has at least one token after it, and the suffix itself
            # (start L-n) is excluded.
            windows = sliding_window_view(seq[: L - 1], n)
            hits = np.flatnonzero((windows == seq[L - n :]).all(axis=1))
            if hits.size:
                start = int(hits[-1]) + n
                proposal = seq[start : start + k].tolist()
                for i, tok in enumerate(proposal):
                    if tok in eos_token_ids:
                        return proposal[: i + 1]
                return proposal
        return []
