"""Draft-free suffix proposals: continue the longest earlier occurrence of the sequence's own suffix.

Pure Python (no numpy needed, no torch), deterministic: it runs inside the `tensorrt_llm_bls` model on a GPU host.
A stronger sibling of prompt lookup (reference/ngram.py), after SuffixDecoding (Oliaro et al., 2024): the match is
searched in the current sequence (prompt + generated) and in a bounded store of earlier requests, the continuation
is chosen by frequency among all occurrences of the match, and the proposal length follows the match's confidence.

Policy of `SuffixProposer.propose(tokens)` (L = len(tokens)):
1. Match. m = the longest suffix length, min_match <= m <= max_match, such that tokens[L-m:] also ends at an earlier
   position e (e < L in the sequence itself — overlapping the suffix is allowed —, any end in a stored sequence)
   with at least one token after it. No such m -> []. A longer match beats a more frequent shorter one. In a stored
   sequence a match counts from the store's anchor_len tokens (>= min_match): another request's text is proposed on
   a longer match than the request's own.
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
anchor hits in the sequence and max_candidates in the whole store (its most recent sequences first), so it is
O(max_candidates * max_match) Python steps, independent of L and of the store's size.

SuffixCache is the served loop's cross-request memory: per deployment (BLS instance), the stores of each scope
(records.speculation.CacheScope: off, per tenant, or one for the deployment), bounded, filled with each finished
request's prompt + output (docs/draft-policy.md, "The cross-request cache").
"""

from __future__ import annotations

import math
import threading
from collections import OrderedDict, deque
from collections.abc import Collection, Sequence
from typing import Optional

from ..records.speculation import CACHE_SCOPES, CacheScope


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
    (a sequence longer than max_tokens keeps only its last max_tokens tokens). A sequence already stored is not
    stored twice: adding it again makes it the most recent. Thread-safe (a lock around add and sources; a stored
    sequence's index never changes, so a proposer reads its snapshot of sources() without the lock)."""

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
            return  # no anchor with a continuation: nothing to find
        with self._lock:
            same = next((item for item in self._seqs if item[1].tokens == toks), None)
            if same is not None:  # a repeat: the stored copy becomes the most recent
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
        if store is not None and not min_match <= store.anchor_len <= max_match:
            raise ValueError(
                f"store.anchor_len ({store.anchor_len}) must be in min_match..max_match ({min_match}..{max_match}): "
                f"create the store with SuffixStore(..., anchor_len={min_match})"
            )
        self.k_max = k_max
        self.min_match = min_match
        self.max_match = max_match
        self.tokens_per_match = tokens_per_match
        self.min_agreement = min_agreement
        self.max_candidates = max_candidates
        self.store = store
        self.store_hit = False  # whether the last proposal's first token drew on the store
        self._own = _Index(min_match)

    def __repr__(self) -> str:
        return (
            f"SuffixProposer(k_max={self.k_max}, min_match={self.min_match}, max_match={self.max_match}, "
            f"tokens_per_match={self.tokens_per_match}, min_agreement={self.min_agreement})"
        )

    def propose(self, tokens: Sequence[int], k: int | None = None, eos_token_ids: Collection[int] = ()) -> list[int]:
        """Up to min(k_max, k) proposed tokens; [] when no suffix of at least min_match tokens occurred before.
        Sets store_hit: whether an occurrence in a stored sequence backed the proposal's first token."""
        self.store_hit = False
        cap = self.k_max if k is None else min(self.k_max, k)
        toks = [int(t) for t in tokens]
        if cap <= 0 or len(toks) < self.min_match:
            return []
        self._own.sync(toks)
        sources = self._sources(toks)
        m, occ = self._longest_match(toks, sources)
        if m == 0:
            return []
        return self._continue(toks, sources, occ, m, cap, eos_token_ids)

    def _sources(self, toks: list[int]) -> list[tuple[list[int], list[int], int]]:
        """(tokens, candidate ends, the match length its anchor guarantees) per source, least recent first (a
        source's rank orders recency): the store's sequences with an anchor hit (at most max_candidates hits in all,
        the most recent sequences and positions first), then the sequence itself (`toks`, the same list)."""
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

    def _continue(self, toks: list[int], sources, occ, m: int, cap: int, eos_token_ids: Collection[int]) -> list[int]:
        """2-3. greedy continuation by frequency, ties to the most recent; length by confidence."""
        n_stored = len(sources) - 1  # ranks below it are stored sequences
        live = occ
        out: list[int] = []
        p = 1.0
        budget = cap
        while len(out) < budget:
            counts: dict[int, list] = {}  # token -> [count, most recent (rank, end), backed by the store]
            for rank, pos in live:
                src = sources[rank][0]
                if pos < len(src):
                    t = src[pos]
                    c = counts.get(t)
                    if c is None:
                        counts[t] = [1, (rank, pos), rank < n_stored]
                    else:
                        c[0] += 1
                        c[2] = c[2] or rank < n_stored
                        if (rank, pos) > c[1]:
                            c[1] = (rank, pos)
            if not counts:
                break
            n_live = sum(c[0] for c in counts.values())
            tok, (cnt, _, stored) = max(counts.items(), key=lambda kv: (kv[1][0], kv[1][1]))
            p *= cnt / n_live
            if p < self.min_agreement:
                break
            if not out:
                budget = min(cap, math.ceil(self.tokens_per_match * m) + cnt - 1)
                self.store_hit = stored
            out.append(tok)
            toks.append(tok)  # the sequence's own occurrences read on into the proposal (periodic text)
            if tok in eos_token_ids:
                break
            live = [
                (rank, pos + 1) for rank, pos in live if pos < len(sources[rank][0]) and sources[rank][0][pos] == tok
            ]
        return out


class SuffixCache:
    """The served loop's cross-request cache, one per deployment (per BLS instance: the writer emits one instance):
    the SuffixStores of its scope, filled with finished requests' prompt + output.

    Scope (records.speculation.CacheScope): `off` keeps nothing; `tenant` keeps one store per tenant, and a request
    without a tenant neither reads nor writes any (so one client's text is never proposed to another); `deployment`
    keeps one store that every request reads and writes, tenant or not.
    Bounds: each store holds at most max_sequences sequences and max_tokens tokens, the oldest evicted first (a tenant
    evicts only its own); under `tenant` at most max_tenants stores, the least recently used tenant's (read or
    written) dropped whole when a new one needs room. Thread-safe (a lock around the tenant map)."""

    def __init__(
        self,
        scope: str,
        *,
        max_tokens: int,
        max_sequences: int,
        max_tenants: int,
        anchor_len: int,
    ):
        if scope not in CACHE_SCOPES:
            raise ValueError(f"suffix cache scope {scope!r}: use one of {', '.join(CACHE_SCOPES)}")
        for name, value in (("max_tokens", max_tokens), ("max_sequences", max_sequences), ("max_tenants", max_tenants)):
            _check_int(name, value, 1)
        self.scope = CacheScope(scope)
        self.max_tokens, self.max_sequences, self.max_tenants = max_tokens, max_sequences, max_tenants
        self.anchor_len = anchor_len
        self._stores: OrderedDict[Optional[str], SuffixStore] = OrderedDict()  # least recently used first
        self._lock = threading.Lock()

    def store(self, tenant: Optional[str]) -> Optional[SuffixStore]:
        """The store a request of `tenant` reads and writes (created empty on first use), or None when the scope gives
        it none (off; tenant scope without a tenant). A proposer holding it sees what later requests add."""
        if self.scope == CacheScope.OFF or (self.scope == CacheScope.TENANT and not tenant):
            return None
        key = tenant if self.scope == CacheScope.TENANT else None
        with self._lock:
            s = self._stores.get(key)
            if s is None:
                s = self._stores[key] = SuffixStore(self.max_sequences, self.max_tokens, anchor_len=self.anchor_len)
                while len(self._stores) > self.max_tenants:
                    self._stores.popitem(last=False)  # the least recently used tenant
            else:
                self._stores.move_to_end(key)
            return s

    def add(self, tenant: Optional[str], tokens: Sequence[int]) -> None:
        """A finished request's prompt + output, into its store (nothing when the scope gives it none)."""
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
