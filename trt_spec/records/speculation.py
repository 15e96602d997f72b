"""Speculation's vocabulary and its maths, defined once: the modes and what each one is, the draft-length policies, the
draft-free proposers, and every figure trt-spec reports about speculation. The bench, the in-process bench, the
Prometheus metrics, the reports, the policy, the deployment chart and docs/ all use these definitions.

Definitions (vLLM's, `vllm/v1/spec_decode/metrics.py`):
- a speculative round (vLLM: a "draft") is one target call that verified k > 0 proposed tokens; a round without
  speculation (k = 0: the draft-length policy decoding a run) is counted separately, never averaged in;
- draft acceptance rate = accepted / drafted tokens;
- mean acceptance length = 1 + accepted / speculative rounds: tokens a speculative round yields;
- per-position acceptance: among speculative rounds, the share whose accepted count exceeded position i.
Model (Leviathan et al. 2023): E(k) = (1 − α^(k+1)) / (1 − α) tokens per round at i.i.d. acceptance α; the speedup
bound S = E(k) / (k·c + r) for draft/target cost c per token and verification cost r decode steps; break-even
acceptance a* = c + (r − 1) / k.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple, Optional, Sequence


class _Word(str, Enum):
    """A config word as an enum: a str (YAML strings parse to it, it compares equal to its string, json.dumps writes
    the string) whose str() and f-string form are the word itself on every Python (3.12 formats enums by name)."""

    def __str__(self) -> str:
        return self.value


class Mode(_Word):
    """A config's `speculative.mode`."""

    DRAFT_TARGET = "draft_target"
    NGRAM = "ngram"
    MEDUSA = "medusa"
    EAGLE = "eagle"
    LOOKAHEAD = "lookahead"
    EAGLE3 = "eagle3"  # runtime: llmapi only (TensorRT-LLM's LLM API: an EAGLE-3 head, one- or two-model)
    MTP = "mtp"  # runtime: llmapi only (the target's own multi-token-prediction layers)
    NONE = "none"

    @property
    def loop_in_bls(self) -> bool:
        """The BLS runs the draft -> verify loop (the target engine verifies external draft tokens)."""
        return self in (Mode.DRAFT_TARGET, Mode.NGRAM)

    @property
    def in_engine(self) -> bool:
        """The target engine speculates by itself in every request (Medusa/EAGLE heads, lookahead)."""
        return self in (Mode.MEDUSA, Mode.EAGLE, Mode.LOOKAHEAD, Mode.EAGLE3, Mode.MTP)

    @property
    def draft_free(self) -> bool:
        """Proposals cost (nearly) nothing: n-gram and lookahead propose from the tokens themselves; Medusa/EAGLE heads
        are a few small layers on the target's own forward."""
        return self in (Mode.NGRAM, Mode.MEDUSA, Mode.EAGLE, Mode.LOOKAHEAD, Mode.EAGLE3, Mode.MTP)

    @property
    def trtllm_name(self) -> Optional[str]:
        """trtllm-build's --speculative_decoding_mode (None: no speculation)."""
        return TRTLLM_SPECULATIVE_MODES.get(self.value)

    @property
    def llmapi_only(self) -> bool:
        """Served by TensorRT-LLM's LLM API only (runtime: llmapi); trtllm-build has no such mode."""
        return self in (Mode.EAGLE3, Mode.MTP)

    @property
    def engine_only(self) -> bool:
        """trtllm-build engine modes (runtime: engine) the LLM API does not serve."""
        return self in (Mode.MEDUSA, Mode.EAGLE, Mode.LOOKAHEAD)

    @property
    def bls_mode(self) -> str:
        """The BLS's `speculative_mode` parameter: the loop's mode, or "engine" when the engine drafts."""
        return self.value if self.loop_in_bls else "engine"


# trtllm-build --speculative_decoding_mode per mode (TensorRT-LLM 1.2 `trtllm-build --help`; n-gram is a draft-target
# target whose drafts come from the BLS's proposer).
TRTLLM_SPECULATIVE_MODES = {
    "draft_target": "draft_tokens_external",
    "ngram": "draft_tokens_external",
    "medusa": "medusa",
    "eagle": "eagle",
    "lookahead": "lookahead_decoding",
}
LOOP_MODES = tuple(m.value for m in Mode if m.loop_in_bls)
BLS_MODES = (*LOOP_MODES, "engine")  # the BLS's speculative_mode parameter


class Policy(_Word):
    """How many tokens a round drafts: one vocabulary and one policy (records/draft_policy.py) for both loops, the BLS's
    draft -> verify loop (`speculative.draft_len_policy`, the BLS's draft_len_policy) and the reference engine's
    in-engine EAGLE chain (its build config's `eagle_draft_policy`: export.py's flag, set from the same key)."""

    ADAPTIVE = "adaptive"  # k per round from measured costs and acceptance, k = 0 (no speculation) included
    FIXED = "fixed"  # every round drafts k = num_draft_tokens (the chain: all max_draft_len drafts)


LOOP_POLICIES = (Policy.ADAPTIVE, Policy.FIXED)  # speculative.draft_len_policy, the BLS's and the chain's policy
# Words engines exported earlier carry in build_config.eagle_draft_policy, and what they read as now: "confidence" was
# the chain's own policy (the head's confidence against costs measured at load, no k = 0 runs); adaptive replaces it.
DEPRECATED_POLICIES = {"confidence": Policy.ADAPTIVE}


def engine_policy(word: str) -> Policy:
    """An engine's `eagle_draft_policy` (a deprecated word read as its replacement); an unknown one is one line."""
    if word in DEPRECATED_POLICIES:
        return DEPRECATED_POLICIES[word]
    if word not in LOOP_POLICIES:
        raise ValueError(f"eagle_draft_policy {word!r}: use one of {', '.join(p.value for p in LOOP_POLICIES)}")
    return Policy(word)


POLICIES = tuple(p.value for p in LOOP_POLICIES)  # the loop's, as strings (the CLI's and the frontend's choices)


class Proposer(_Word):
    """n-gram mode's draft-free proposer (trt_spec/in_triton/suffix.py, speculative_loop.py)."""

    SUFFIX = "suffix"  # longest suffix match, by frequency
    PROMPT_LOOKUP = "prompt_lookup"  # the last ngram_size tokens matched in the sequence


PROPOSERS = tuple(p.value for p in Proposer)


class CacheScope(_Word):
    """Who shares the suffix proposer's cross-request cache (`speculative.suffix_cache.scope`; in_triton/suffix.py
    SuffixCache): earlier requests' text is proposed only to requests of the same scope."""

    OFF = "off"  # no cache: each request searches only its own sequence
    TENANT = "tenant"  # one store per tenant (the BLS's optional `tenant` input); no tenant: no cache
    DEPLOYMENT = "deployment"  # one store shared by every request of the deployment


CACHE_SCOPES = tuple(s.value for s in CacheScope)


def expected_tokens(alpha: float, k: int) -> float:
    """E(k) = (1 − α^(k+1)) / (1 − α): tokens a round with k drafts yields under i.i.d. acceptance α."""
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def solve_alpha(mean_len: float, k: int) -> float:
    """The α with E(k) = mean_len (bisection; 0 when no gain, 1 at the k + 1 ceiling)."""
    if k <= 0 or mean_len <= 1.0:
        return 0.0
    if mean_len >= k + 1:
        return 1.0
    lo, hi = 0.0, 1.0
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if expected_tokens(mid, k) < mean_len else (lo, mid)
    return (lo + hi) / 2


def leviathan_bound(alpha: float, k: int, c: float, verify_cost: float = 1.0) -> float:
    """Expected speedup (Leviathan et al. 2023, Thm 3.8): S = E(k) / (k·c + r), α = per-token acceptance rate,
    c = draft/target cost ratio per token, r = the (k + 1)-token verification pass in target decode steps (1 on a GPU
    at small batch, as the theorem assumes; more where verification is not free)."""
    if k <= 0:
        return 1.0
    return expected_tokens(alpha, k) / (k * c + verify_cost)


def break_even_acceptance(k: int, c: float, verify_cost: float = 1.0) -> float:
    """The acceptance rate (accepted / drafted) under which speculation at draft length k is slower than decoding.

    A round of k drafts costs k·c + r decode steps and yields 1 + a·k tokens at acceptance rate a; it pays while
    1 + a·k > k·c + r, so a* = c + (r − 1) / k. No i.i.d. model is needed: it holds for the measured averages when
    every round drafts k. On a GPU at small batch r ≈ 1 and a* ≈ c; on a CPU r > 1 raises it."""
    if k <= 0:
        raise ValueError(f"k must be >= 1 for a break-even acceptance, got {k}")
    return c + (verify_cost - 1.0) / k


def acceptance_rate(accepted: int, drafted: int) -> Optional[float]:
    """accepted / drafted draft tokens; None when nothing was drafted."""
    return accepted / drafted if drafted else None


def mean_acceptance_length(accepted: int, speculative_rounds: int) -> Optional[float]:
    """1 + accepted / speculative rounds (rounds that verified k > 0 drafts; rounds without speculation are counted
    separately); None when no round speculated."""
    return 1.0 + accepted / speculative_rounds if speculative_rounds else None


# -- Measured figures: one speedup and one acceptance summary for every report -----------------------------------------
# Every bench mode (served, OpenAI, in-process, tune), the concurrency sweep's acceptance, the Prometheus read-back and
# benchmarks/compare_modes.py report these two, so one name means one number wherever it is printed.


class Speedup(NamedTuple):
    """Speculative vs baseline over paired requests (paired_speedup): the point estimate and its interval."""

    point: float
    low: float
    high: float


def paired_speedup(
    baseline_s: Sequence[float],
    speculative_s: Sequence[float],
    *,
    iters: int = 2000,
    seed: int = 0,
    level: float = 0.95,
) -> Speedup:
    """THE speedup: Σ baseline seconds / Σ speculative seconds over paired requests (pair i: the same prompt, repeat
    and parameters on each side; greedy, so the same tokens), with a paired bootstrap interval at `level` (pairs
    resampled, seeded: the same timings give the same interval). A ratio of sums, not a mean of per-request ratios:
    each request weighs by its time, as a user's wait does."""
    if len(baseline_s) != len(speculative_s) or not baseline_s:
        raise ValueError(
            f"a paired speedup needs as many baseline as speculative timings (at least one), got "
            f"{len(baseline_s)} and {len(speculative_s)}"
        )
    n = len(baseline_s)
    rng = random.Random(seed)
    stats = []
    for _ in range(iters):
        idx = [rng.randrange(n) for _ in range(n)]
        d = sum(speculative_s[i] for i in idx)
        if d > 0:
            stats.append(sum(baseline_s[i] for i in idx) / d)
    stats.sort()
    lo = stats[int((1 - level) / 2 * len(stats))]
    hi = stats[min(len(stats) - 1, int((1 + level) / 2 * len(stats)))]
    return Speedup(sum(baseline_s) / sum(speculative_s), lo, hi)


@dataclass(frozen=True)
class AcceptanceCounts:
    """Speculation totals over a set of finished requests, whoever counted them: the bench sums its requests' outputs
    (harness.bench.request_acceptance_counts), the Prometheus read-back takes the BLS's counters
    (in_triton.spec_metrics.scraped_acceptance_counts). An empty tuple: the source does not report that figure."""

    requests: int = 0
    accepted: int = 0  # draft tokens the target accepted
    drafted: int = 0  # draft tokens proposed
    steps: int = 0  # target calls (rounds), speculating or not
    speculative_rounds: int = 0  # rounds that verified k > 0 drafts
    rounds_without_speculation: int = 0  # rounds whose chosen k was 0
    histogram: tuple[int, ...] = ()  # speculative rounds by accepted count 0..k
    draft_length_counts: tuple[int, ...] = ()  # rounds by chosen k 0..K
    source: Optional[str] = None  # where accepted/steps came from when not the model's own counts
    notes: tuple[str, ...] = ()  # corrections to those counts, each with how many requests it applied to


def acceptance_summary(c: AcceptanceCounts) -> dict:
    """THE acceptance summary (one key set, every report): the counts; acceptance rate, mean acceptance length and
    per-position acceptance (the definitions at the top); the draft-length policy at work (rounds by chosen k, mean k
    when speculating, share of rounds without speculation: over the rounds whose k is known, else all steps). An
    acceptance ratio without a denominator is None (never a made-up 0); the policy's figures are then 0.0."""
    hist, ks = list(c.histogram), list(c.draft_length_counts)
    positions = max(len(hist) - 1, 0)
    chosen = sum(ks[1:])
    rounds = sum(ks) if ks else c.steps
    return {
        "source": c.source,
        "notes": list(c.notes),
        "accepted": c.accepted,
        "drafted": c.drafted,
        "steps": c.steps,
        "speculative_rounds": c.speculative_rounds,
        "acceptance_rate": acceptance_rate(c.accepted, c.drafted),
        "mean_acceptance_length": mean_acceptance_length(c.accepted, c.speculative_rounds),
        "histogram": hist,
        "per_position_acceptance": [
            sum(hist[i + 1 :]) / c.speculative_rounds if c.speculative_rounds else 0.0 for i in range(positions)
        ],
        "draft_length_counts": ks,
        "mean_draft_length": sum(k * n for k, n in enumerate(ks)) / chosen if chosen else 0.0,
        "rounds_without_speculation_share": c.rounds_without_speculation / rounds if rounds else 0.0,
        "requests": c.requests,
        "rounds_without_speculation": c.rounds_without_speculation,
    }
