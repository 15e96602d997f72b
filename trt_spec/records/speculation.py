"""Speculation's vocabulary (modes, draft-length policies, proposers) and every figure trt-spec reports about it.

A speculative round is one target call that verified k > 0 drafts; rounds with k = 0 are counted apart
(upstream-facts: vllm-spec-decode-metric-definitions). Model: Leviathan et al. 2023.
"""

from __future__ import annotations

import dataclasses
import random
import typing
from dataclasses import dataclass
from enum import Enum
from typing import NamedTuple, Optional, Sequence


class _Word(str, Enum):
    """A str enum whose str() and f-string form are the word itself on every Python (3.12 formats enums by name)."""

    def __str__(self) -> str:
        return self.value


def as_words(record) -> None:
    """In a frozen dataclass's __post_init__: every field typed as a config word holds its member, not a plain string
    (a caller or a JSON file may give either)."""
    hints = typing.get_type_hints(type(record))
    for f in dataclasses.fields(record):
        kind = hints[f.name]
        if isinstance(kind, type) and issubclass(kind, _Word):
            object.__setattr__(record, f.name, kind(getattr(record, f.name)))


class Runtime(_Word):
    """A config's `runtime`: TensorRT-LLM engines behind the tensorrtllm backend, or its LLM API."""

    ENGINE = "engine"
    LLMAPI = "llmapi"


class Engine(_Word):
    """A config's `engine`: TensorRT-LLM on GPUs, or the CPU reference engine."""

    TENSORRT = "tensorrt"
    REFERENCE = "reference"


class Mode(_Word):
    """A config's `speculative.mode`."""

    DRAFT_TARGET = "draft_target"
    NGRAM = "ngram"
    MEDUSA = "medusa"
    EAGLE = "eagle"
    LOOKAHEAD = "lookahead"
    EAGLE3 = "eagle3"  # llmapi only
    MTP = "mtp"  # llmapi only: the target's own multi-token-prediction layers
    NONE = "none"

    @property
    def loop_in_bls(self) -> bool:
        """The BLS runs the draft -> verify loop."""
        return self in (Mode.DRAFT_TARGET, Mode.NGRAM)

    @property
    def in_engine(self) -> bool:
        """The target engine speculates by itself."""
        return self in (Mode.MEDUSA, Mode.EAGLE, Mode.LOOKAHEAD, Mode.EAGLE3, Mode.MTP)

    @property
    def draft_free(self) -> bool:
        """Proposals cost (nearly) nothing: no separate draft model."""
        return self in (Mode.NGRAM, Mode.MEDUSA, Mode.EAGLE, Mode.LOOKAHEAD, Mode.EAGLE3, Mode.MTP)

    @property
    def trtllm_name(self) -> Optional[str]:
        """trtllm-build's --speculative_decoding_mode (None: no speculation)."""
        return TRTLLM_SPECULATIVE_MODES.get(self.value)

    @property
    def llmapi_only(self) -> bool:
        """Served by the LLM API only; trtllm-build has no such mode."""
        return self in (Mode.EAGLE3, Mode.MTP)

    @property
    def engine_only(self) -> bool:
        """trtllm-build engine modes the LLM API does not serve."""
        return self in (Mode.MEDUSA, Mode.EAGLE, Mode.LOOKAHEAD)

    @property
    def bls_mode(self) -> str:
        """The BLS's `speculative_mode` parameter: the loop's mode, or "engine" when the engine drafts."""
        return self.value if self.loop_in_bls else "engine"


# n-gram's target is a draft-target engine fed by the BLS's proposer (upstream-facts: trtllm-build-speculative-modes).
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
    """How many tokens a round drafts, for the BLS's loop and the reference engine's EAGLE chain alike."""

    ADAPTIVE = "adaptive"  # k per round from measured costs and acceptance, k = 0 included
    FIXED = "fixed"  # every round drafts num_draft_tokens


LOOP_POLICIES = (Policy.ADAPTIVE, Policy.FIXED)


def engine_policy(word: str) -> Policy:
    """An engine's `eagle_draft_policy`; raises ValueError naming the choices if unknown."""
    if word not in POLICIES:
        raise ValueError(f"eagle_draft_policy {word!r}: use one of {', '.join(POLICIES)}")
    return Policy(word)


POLICIES = tuple(p.value for p in LOOP_POLICIES)


class Proposer(_Word):
    """n-gram mode's draft-free proposer."""

    SUFFIX = "suffix"  # longest suffix match, by frequency
    PROMPT_LOOKUP = "prompt_lookup"  # the last ngram_size tokens matched in the sequence


PROPOSERS = tuple(p.value for p in Proposer)


class CacheScope(_Word):
    """Who shares the suffix proposer's cross-request cache: text is proposed only within one scope."""

    OFF = "off"
    TENANT = "tenant"  # one store per tenant; a request without a tenant: no cache
    DEPLOYMENT = "deployment"


CACHE_SCOPES = tuple(s.value for s in CacheScope)


def expected_tokens(alpha: float, k: int) -> float:
    """E(k) = (1 − α^(k+1)) / (1 − α): tokens a round with k drafts yields under i.i.d. acceptance α."""
    if k <= 0:
        return 1.0
    if alpha >= 1.0:
        return k + 1.0
    return (1 - alpha ** (k + 1)) / (1 - alpha)


def solve_alpha(mean_len: float, k: int) -> float:
    """The α with E(k) = mean_len, by bisection."""
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
    """Expected speedup S = E(k) / (k·c + r) (Leviathan et al. 2023, Thm 3.8).

    c: draft/target cost per token; r: the verification pass in target decode steps (1 on a GPU at small batch)."""
    if k <= 0:
        return 1.0
    return expected_tokens(alpha, k) / (k * c + verify_cost)


def break_even_acceptance(k: int, c: float, verify_cost: float = 1.0) -> float:
    """The acceptance rate below which speculating k tokens is slower than decoding: a* = c + (r − 1) / k.

    From 1 + a·k > k·c + r; needs no i.i.d. model when every round drafts k."""
    if k <= 0:
        raise ValueError(f"k must be >= 1 for a break-even acceptance, got {k}")
    return c + (verify_cost - 1.0) / k


def acceptance_rate(accepted: int, drafted: int) -> Optional[float]:
    """accepted / drafted draft tokens; None when nothing was drafted."""
    return accepted / drafted if drafted else None


def mean_acceptance_length(accepted: int, speculative_rounds: int) -> Optional[float]:
    """1 + accepted / speculative rounds; None when no round speculated."""
    return 1.0 + accepted / speculative_rounds if speculative_rounds else None


# -- One speedup and one acceptance summary for every report, so one name means one number wherever printed.


class Speedup(NamedTuple):
    """Speculative vs baseline over paired requests: the point estimate and its interval."""

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
    """Σ baseline seconds / Σ speculative seconds over paired requests, with a seeded paired-bootstrap interval.

    A ratio of sums, not a mean of ratios: each request weighs by its time, as a user's wait does."""
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
    """Speculation totals over a set of finished requests; an empty tuple: the source does not report it."""

    requests: int = 0
    accepted: int = 0
    drafted: int = 0
    steps: int = 0  # target calls, speculating or not
    speculative_rounds: int = 0  # rounds that verified k > 0 drafts
    rounds_without_speculation: int = 0
    histogram: tuple[int, ...] = ()  # speculative rounds by accepted count 0..k
    draft_length_counts: tuple[int, ...] = ()  # rounds by chosen k 0..K
    source: Optional[str] = None  # where accepted/steps came from when not the model's own counts
    notes: tuple[str, ...] = ()  # corrections to those counts


def acceptance_summary(c: AcceptanceCounts) -> dict:
    """The acceptance summary every report prints (one key set).

    A ratio without a denominator is None (never a made-up 0); the policy's figures are then 0.0."""
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
