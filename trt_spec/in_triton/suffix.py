"""Draft-free suffix proposals: continue the longest earlier occurrence of the sequence's own suffix.

Pure Python (no numpy needed, no torch), deterministic: it runs inside the `tensorrt_llm_bls` model on a GPU host.
A stronger sibling of prompt lookup (reference/ngram.py), after SuffixDecoding (Oliaro et al., 2024): the match is
searched in the current sequence (prompt + generated) and in a bounded store of earlier requests, the continuation
is chosen by frequency among all occurrences of the match, and the proposal length follows the match's confidence.

Policy of `SuffixProposer.propose(tokens)` (L = len(tokens)):
1. Match. m = the longest suffix length, min_match <= m <= max_match, such that tokens[L-m:] also ends at an earlier
   position e (e < L in the sequence itself — overlapping the suffix is allowed —, any end in a stored sequence)
   with at least one token after it. No such m -> []. A longer match beats a more frequent shorter one.
2. Continuation, token by token. The occurrences are every earlier end of that m-token suffix. At each step the
   next token is the most frequent among the live occurrences' next tokens; a tie goes to the token whose latest
   occurrence is the most recent (the current sequence is more recent than the store, a later position more
   recent than an earlier one, a later-stored request more recent than an earlier one). Occurrences that disagree
   or run out of tokens drop out; the proposal stops when none is left. An occurrence in the sequence itself
   that reaches its end reads on into the proposal, so a periodic tail ("a b a b a b") continues its period.
3. Length. agreement p = the product over steps of (occurrences choosing the token / live occurrences); a token is
   not proposed once p would fall below min_agreement. The length is at most
       budget = min(k_max, k, ceil(tokens_per_match * m) + (c1 - 1))
   where c1 is how many occurrences agree on the first token: a longer match and more agreeing occurrences give a
   longer proposal, one matched token buys `tokens_per_match` proposed tokens. The proposal ends at the first
   EOS it contains (EOS included), as in prompt lookup.

Cost: an index anchor (the last min_match tokens) -> end positions, updated incrementally while the sequence only
grows (rebuilt when it does not); a call extends the match backwards from at most max_candidates most recent
anchor hits per source, so it is O(max_candidates * max_match) Python steps, independent of L.
"""

from __future__ import annotations

import math
from collections import deque
from collections.abc import Collection, Sequence


def _check_int(name: str, value: int, lo: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")


class _Index:
    """anchor (tuple of `anchor_len` tokens) -> ascending end positions e (tokens[e-anchor_len:e] == anchor)."""

    __slots__ = ("anchor_len", "tokens", "ends")

    def __init__(self, anchor_len: int, tokens: Sequence[int] = ()):
        self.anchor_len = anchor_len
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], list[int]] = {}
        self.extend(tokens)

    def extend(self, new: Sequence[int]) -> None:
        toks = self.tokens
        a = self.anchor_len
        first = len(toks) + 1
        toks.extend(int(t) for t in new)
        ends = self.ends
        for e in range(max(first, a), len(toks) + 1):
            key = tuple(toks[e - a : e])
            hit = ends.get(key)
            if hit is None:
                ends[key] = [e]
            else:
                hit.append(e)

    def sync(self, tokens: list[int]) -> None:
        """Make the index describe `tokens`: extend when it only grew, rebuild otherwise."""
        n = len(self.tokens)
        if len(tokens) >= n and tokens[:n] == self.tokens:
            if len(tokens) > n:
                self.extend(tokens[n:])
        else:
            self.tokens, self.ends = [], {}
            self.extend(tokens)


class SuffixStore:
    """Earlier sequences (prompt + output of finished requests) searched by every proposer that shares the store.

    Bounded: at most max_sequences sequences and max_tokens tokens in all; the oldest are evicted first
    (a sequence longer than max_tokens keeps only its last max_tokens tokens). Not thread-safe (the BLS's asyncio
    loop is single-threaded)."""

    def __init__(self, max_sequences: int = 16, max_tokens: int = 65536, *, anchor_len: int = 2):
        _check_int("max_sequences", max_sequences, 1)
        _check_int("max_tokens", max_tokens, 1)
        _check_int("anchor_len", anchor_len, 1)
        self.max_sequences = max_sequences
        self.max_tokens = max_tokens
        self.anchor_len = anchor_len
        self._seqs: deque[tuple[int, _Index]] = deque()  # (insertion serial, index), oldest first
        self._serial = 0
        self._tokens = 0

    def __len__(self) -> int:
        return len(self._seqs)

    @property
    def num_tokens(self) -> int:
        return self._tokens

    def add(self, tokens: Sequence[int]) -> None:
        toks = [int(t) for t in tokens][-self.max_tokens :]
        if len(toks) <= self.anchor_len:
            return  # no anchor with a continuation: nothing to find
        self._seqs.append((self._serial, _Index(self.anchor_len, toks)))
        self._serial += 1
        self._tokens += len(toks)
        while len(self._seqs) > self.max_sequences or self._tokens > self.max_tokens:
            _, old = self._seqs.popleft()
            self._tokens -= len(old.tokens)

    def sources(self) -> list[tuple[int, _Index]]:
        return list(self._seqs)


class SuffixProposer:
    """Per-request suffix proposer (see the module docstring for the policy). Reuse one object across the rounds
    of a request: its index of the request's own sequence is extended incrementally."""

    def __init__(
        self,
        k_max: int = 8,
        *,
        min_match: int = 2,
        max_match: int = 32,
        tokens_per_match: float = 1.0,
        min_agreement: float = 0.0,
        max_candidates: int = 256,
        store: SuffixStore | None = None,
    ):
        _check_int("k_max", k_max, 0)
        _check_int("min_match", min_match, 1)
        _check_int("max_match", max_match, min_match)
        _check_int("max_candidates", max_candidates, 1)
        if not tokens_per_match > 0:
            raise ValueError(f"tokens_per_match must be > 0, got {tokens_per_match!r}")
        if not 0.0 <= min_agreement <= 1.0:
            raise ValueError(f"min_agreement must be in [0, 1], got {min_agreement!r}")
        if store is not None and store.anchor_len != min_match:
            raise ValueError(
                f"store.anchor_len ({store.anchor_len}) must equal min_match ({min_match}): "
                f"create the store with SuffixStore(..., anchor_len={min_match})"
            )
        self.k_max = k_max
        self.min_match = min_match
        self.max_match = max_match
        self.tokens_per_match = tokens_per_match
        self.min_agreement = min_agreement
        self.max_candidates = max_candidates
        self.store = store
        self._own = _Index(min_match)

    def __repr__(self) -> str:
        return (
            f"SuffixProposer(k_max={self.k_max}, min_match={self.min_match}, max_match={self.max_match}, "
            f"tokens_per_match={self.tokens_per_match}, min_agreement={self.min_agreement})"
        )

    def propose(self, tokens: Sequence[int], k: int | None = None, eos_token_ids: Collection[int] = ()) -> list[int]:
        """Up to min(k_max, k) proposed tokens; [] when no suffix of at least min_match tokens occurred before."""
        cap = self.k_max if k is None else min(self.k_max, k)
        toks = [int(t) for t in tokens]
        L = len(toks)
        a = self.min_match
        if cap <= 0 or L < a:
            return []
        self._own.sync(toks)
        key = tuple(toks[L - a :])
        # Sources, least recent first; the rank orders recency across sources.
        sources: list[tuple[list[int], list[int]]] = []
        if self.store is not None:
            for _, idx in self.store.sources():
                sources.append((idx.tokens, idx.ends.get(key, [])))
        sources.append((toks, [e for e in self._own.ends.get(key, ())[-self.max_candidates - 1 :] if e < L]))

        # 1. the longest match m and its occurrences (rank, end).
        m, occ = 0, []
        mmax = self.max_match
        for rank, (src, ends) in enumerate(sources):
            for e in reversed(ends[-self.max_candidates :]):
                if e >= len(src):
                    continue  # no continuation
                j = a
                lim = min(mmax, e, L)
                while j < lim and src[e - j - 1] == toks[L - j - 1]:
                    j += 1
                if j > m:
                    m, occ = j, [(rank, e)]
                elif j == m:
                    occ.append((rank, e))
        if m < a:
            return []

        # 2-3. greedy continuation by frequency, ties to the most recent; length by confidence.
        live = occ
        out: list[int] = []
        p = 1.0
        budget = cap
        while len(out) < budget:
            counts: dict[int, list] = {}  # token -> [count, most recent (rank, end)]
            for rank, pos in live:
                src = sources[rank][0]
                if pos < len(src):
                    t = src[pos]
                    c = counts.get(t)
                    if c is None:
                        counts[t] = [1, (rank, pos)]
                    else:
                        c[0] += 1
                        if (rank, pos) > c[1]:
                            c[1] = (rank, pos)
            if not counts:
                break
            n_live = sum(c[0] for c in counts.values())
            tok, (cnt, _) = max(counts.items(), key=lambda kv: (kv[1][0], kv[1][1]))
            p *= cnt / n_live
            if p < self.min_agreement:
                break
            if not out:
                budget = min(cap, math.ceil(self.tokens_per_match * m) + cnt - 1)
            out.append(tok)
            toks.append(tok)  # the sequence's own occurrences read on into the proposal (periodic text)
            if tok in eos_token_ids:
                break
            live = [
                (rank, pos + 1) for rank, pos in live if pos < len(sources[rank][0]) and sources[rank][0][pos] == tok
            ]
        return out
