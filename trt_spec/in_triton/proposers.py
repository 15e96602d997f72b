"""n-gram mode's draft-free proposers for the BLS and `bench in-process`: prompt lookup (NgramDraft) and the suffix
proposer (after SuffixDecoding, Oliaro et al. 2024) with its cross-request cache.

numpy at most: they run inside the BLS on a GPU host.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from collections.abc import Collection, Sequence
from dataclasses import dataclass
from typing import Optional

import numpy as np
from numpy.lib.stride_tricks import sliding_window_view

from ..records import defaults
from ..records.bls_parameters import BlsParameters
from ..records.deployment import SuffixCacheConfig
from ..records.draft_policy import Evidence
from ..records.speculation import CacheScope, Proposer


def _check_int(name: str, value: int, lo: int) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or value < lo:
        raise ValueError(f"{name} must be an integer >= {lo}, got {value!r}")


class _Index:
    """anchor (`anchor_len` tokens) -> ascending end positions e with tokens[e-anchor_len:e] == anchor."""

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

    def sync(self, tokens: list[int]) -> bool:
        """Make the index describe `tokens`: extend when it only grew (True), rebuild otherwise (False)."""
        n = len(self.tokens)
        if len(tokens) >= n and tokens[:n] == self.tokens:
            if len(tokens) > n:
                self.extend(tokens[n:])
            return True
        self.tokens, self.ends = [], {}
        self.extend(tokens)
        return False


class SuffixStore:
    """Finished requests' prompt + output, bounded by max_sequences and max_tokens, oldest evicted first.

    Thread-safe; a stored sequence's index never changes, so a snapshot of sources() is read without the lock."""

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
        self._lock = threading.Lock()

    def __len__(self) -> int:
        return len(self._seqs)

    @property
    def num_tokens(self) -> int:
        return self._tokens

    def add(self, tokens: Sequence[int]) -> None:
        toks = [int(t) for t in tokens][-self.max_tokens :]
        if len(toks) <= self.anchor_len:
            return  # no anchor with a continuation
        with self._lock:
            same = next((item for item in self._seqs if item[1].tokens == toks), None)
            if same is not None:  # a repeat becomes the most recent
                self._seqs.remove(same)
                self._seqs.append((self._serial, same[1]))
            else:
                self._seqs.append((self._serial, _Index(self.anchor_len, toks)))
                self._tokens += len(toks)
            self._serial += 1
            while len(self._seqs) > self.max_sequences or self._tokens > self.max_tokens:
                _, old = self._seqs.popleft()
                self._tokens -= len(old.tokens)

    def sources(self) -> list[tuple[int, _Index]]:
        """The stored sequences, oldest first (a snapshot)."""
        with self._lock:
            return list(self._seqs)


@dataclass(frozen=True)
class Candidate:
    """A proposal as far as the match supports, with each token's evidence for the policy to weigh."""

    tokens: list[int]
    # per token: (match length, occurrences agreeing on it, live occurrences); None: the proposer gives none
    evidence: Optional[list[Evidence]]


class WithoutEvidence:
    """A proposer whose propose() gives tokens only: its candidate has no evidence, so the policy verifies it whole."""

    def candidate(self, tokens: Sequence[int], k: int | None = None, eos_token_ids: Collection[int] = ()) -> Candidate:
        return Candidate(self.propose(tokens, k, eos_token_ids), None)


class SuffixProposer:
    """Per-request suffix proposer; reuse it across a request's rounds (its own index grows incrementally).

    Match: the longest suffix (min_match..max_match) that also ends earlier with a token after it, in the sequence
    or the store (where it counts from the store's anchor_len). Continuation: the most frequent next token among
    the live occurrences (ties: a token that goes on before an end token, then the occurrence where the last
    candidate's copy would be now, then the most recent), for as long as an occurrence goes on (up to the cap,
    ending at an EOS, included); how much of it to verify is the policy's call (RequestPolicy.confirm). A call costs
    O(max_candidates * max_match), independent of the sequence and store sizes."""

    def __init__(
        self,
        k_max: int = 8,
        *,
        min_match: int = 2,
        max_match: int = 32,
        max_candidates: int = 256,
        store: SuffixStore | None = None,
    ):
        _check_int("k_max", k_max, 0)
        _check_int("min_match", min_match, 1)
        _check_int("max_match", max_match, min_match)
        _check_int("max_candidates", max_candidates, 1)
        if store is not None and not min_match <= store.anchor_len <= max_match:
            raise ValueError(
                f"store.anchor_len ({store.anchor_len}) must be in min_match..max_match ({min_match}..{max_match}): "
                f"create the store with SuffixStore(..., anchor_len={min_match})"
            )
        self.k_max = k_max
        self.min_match = min_match
        self.max_match = max_match
        self.max_candidates = max_candidates
        self.store = store
        self.store_hit = False  # whether the last proposal's first token drew on the store
        self._own = _Index(min_match)
        self._copy: Optional[tuple] = None  # the last candidate's source (None: own), start, sequence length

    def __repr__(self) -> str:
        return f"SuffixProposer(k_max={self.k_max}, min_match={self.min_match}, max_match={self.max_match})"

    def propose(self, tokens: Sequence[int], k: int | None = None, eos_token_ids: Collection[int] = ()) -> list[int]:
        """The candidate's tokens: up to min(k_max, k), [] without a match; sets store_hit."""
        return self.candidate(tokens, k, eos_token_ids).tokens

    def candidate(self, tokens: Sequence[int], k: int | None = None, eos_token_ids: Collection[int] = ()) -> Candidate:
        """Up to min(k_max, k) tokens as far as the match supports, with their evidence; sets store_hit."""
        self.store_hit = False
        cap = self.k_max if k is None else min(self.k_max, k)
        toks = [int(t) for t in tokens]
        if cap <= 0 or len(toks) < self.min_match:
            return Candidate([], [])
        if not self._own.sync(toks):
            self._copy = None  # another sequence: the running copy was another's
        sources = self._sources(toks)
        m, occ = self._longest_match(toks, sources)
        if m == 0:
            return Candidate([], [])
        return self._continue(toks, sources, occ, m, cap, eos_token_ids)

    def _sources(self, toks: list[int]) -> list[tuple[list[int], list[int], int]]:
        """(tokens, candidate ends, anchor match length) per source, least recent first; `toks` itself last."""
        L = len(toks)
        stored: list[tuple[list[int], list[int], int]] = []
        if self.store is not None and L >= self.store.anchor_len:
            sa = self.store.anchor_len
            key = tuple(toks[L - sa :])
            budget = self.max_candidates
            for _, idx in reversed(self.store.sources()):
                ends = idx.ends.get(key)
                if ends:
                    take = ends[-budget:]
                    stored.append((idx.tokens, take, sa))
                    budget -= len(take)
                    if budget <= 0:
                        break
            stored.reverse()
        a = self.min_match
        own = [e for e in self._own.ends.get(tuple(toks[L - a :]), ())[-self.max_candidates - 1 :] if e < L]
        return [*stored, (toks, own[-self.max_candidates :], a)]

    def _longest_match(self, toks: list[int], sources) -> tuple[int, list[tuple[int, int]]]:
        """The longest match m and its occurrences (rank, end); (0, []) when none."""
        L, m, occ = len(toks), 0, []
        for rank, (src, ends, j0) in enumerate(sources):
            for e in reversed(ends):
                if e >= len(src):
                    continue  # no continuation
                j, lim = j0, min(self.max_match, e, L)
                while j < lim and src[e - j - 1] == toks[L - j - 1]:
                    j += 1
                if j > m:
                    m, occ = j, [(rank, e)]
                elif j == m:
                    occ.append((rank, e))
        return m, occ

    def _continue(self, toks: list[int], sources, occ, m: int, cap: int, eos_token_ids: Collection[int]) -> Candidate:
        n_stored = len(sources) - 1  # ranks below it are stored sequences
        L0 = len(toks)
        at = None  # where the last candidate's copy would be now, had the target followed it: (source, position)
        if self._copy is not None:
            src0, pos0, len0 = self._copy
            at = (src0, pos0 + L0 - len0)

        def near(rank: int, start: int) -> tuple:
            """Tie-break among occurrences: nearest the running copy, then the most recent."""
            src = sources[rank][0] if rank < n_stored else None  # None: the request's own sequence
            d = -abs(start - at[1]) if at is not None and src is at[0] else -(1 << 62)
            return (d, rank, start)

        live = occ
        out: list[int] = []
        evidence: list[Evidence] = []
        first = None
        while len(out) < cap:
            counts: dict[int, list] = {}  # token -> [count, best tie-break, its (rank, start), backed by the store]
            for rank, pos in live:
                src = sources[rank][0]
                if pos < len(src):
                    t = src[pos]
                    key = near(rank, pos - len(out))
                    c = counts.get(t)
                    if c is None:
                        counts[t] = [1, key, (rank, pos - len(out)), rank < n_stored]
                    else:
                        c[0] += 1
                        c[3] = c[3] or rank < n_stored
                        if key > c[1]:
                            c[1], c[2] = key, (rank, pos - len(out))
            if not counts:
                break
            n_live = sum(c[0] for c in counts.values())
            # most occurrences; on a tie a token that goes on beats an end token (it can yield more), then nearest
            tok, (cnt, _, occ_at, stored) = max(
                counts.items(), key=lambda kv: (kv[1][0], kv[0] not in eos_token_ids, kv[1][1])
            )
            if not out:
                self.store_hit = stored
                first = occ_at
            evidence.append((m + len(out), cnt, n_live))  # each token read on lengthens the match by one
            out.append(tok)
            toks.append(tok)  # own occurrences read on into the proposal (periodic text)
            if tok in eos_token_ids:
                break
            live = [
                (rank, pos + 1) for rank, pos in live if pos < len(sources[rank][0]) and sources[rank][0][pos] == tok
            ]
        if first is not None:
            rank, start = first
            self._copy = (sources[rank][0] if rank < n_stored else None, start, L0)
        return Candidate(out, evidence)


class SuffixCache:
    """The served loop's cross-request cache, one per BLS instance: a SuffixStore per scope key.

    Under `tenant` scope one client's text is never proposed to another; at most max_tenants stores, the least
    recently used dropped whole. Thread-safe."""

    def __init__(self, cfg: SuffixCacheConfig):
        for name in ("max_tokens", "max_sequences", "max_tenants", "min_match"):
            _check_int(name, getattr(cfg, name), 1)
        self.cfg = cfg
        self.scope = CacheScope(cfg.scope)
        self.anchor_len = cfg.min_match
        self._stores: OrderedDict[Optional[str], SuffixStore] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()

    def store(self, tenant: Optional[str]) -> Optional[SuffixStore]:
        """The store of `tenant` (created on first use), or None when the scope gives it none."""
        if self.scope == CacheScope.OFF or (self.scope == CacheScope.TENANT and not tenant):
            return None
        key = tenant if self.scope == CacheScope.TENANT else None
        with self._lock:
            s = self._stores.get(key)
            if s is None:
                s = self._stores[key] = SuffixStore(
                    self.cfg.max_sequences, self.cfg.max_tokens, anchor_len=self.anchor_len
                )
                while len(self._stores) > self.cfg.max_tenants:
                    self._stores.popitem(last=False)
            else:
                self._stores.move_to_end(key)
            return s

    def add(self, tenant: Optional[str], tokens: Sequence[int]) -> None:
        """Store a finished request's prompt + output, if its scope has a store."""
        s = self.store(tenant)
        if s is not None:
            s.add(tokens)

    @property
    def num_tokens(self) -> int:
        """Tokens held in all stores."""
        with self._lock:
            return sum(s.num_tokens for s in self._stores.values())

    @property
    def num_stores(self) -> int:
        return len(self._stores)


class NgramDraft(WithoutEvidence):
    """Prompt lookup: propose what followed the most recent earlier match of the last n tokens (longest n first)."""

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
        """Up to k proposed tokens, ending at the first EOS (included); [] when no n-gram matches."""
        k = self.k if k is None else k
        seq = np.asarray(tokens, dtype=np.int64)
        L = len(seq)
        if k <= 0 or L < 2:
            return []
        for n in range(min(self.max_ngram, L - 1), self.min_ngram - 1, -1):
            # starts 0 .. L-1-n: each window has a token after it; the suffix itself is excluded
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


def proposer_for(p: BlsParameters, store: Optional[SuffixStore] = None):
    """n-gram mode's proposer as the deployment names it; `store` is the request's cross-request cache."""
    if p.proposer is Proposer.PROMPT_LOOKUP:
        return NgramDraft(max_ngram=p.ngram_size, k=p.max_draft_len)
    return SuffixProposer(k_max=p.max_draft_len, min_match=defaults.SUFFIX_MIN_MATCH, store=store)
