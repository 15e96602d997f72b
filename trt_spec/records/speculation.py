"""Speculation's vocabulary and its maths, defined once: the modes and what each one is, the draft-length policies, the
draft-free proposers, and every figure trt-spec reports about speculation. The bench, the in-process bench, the
Prometheus metrics, the reports, the policy, the deployment chart and README all use these definitions.

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

from enum import Enum
from typing import Optional


class Mode(str, Enum):
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
TRTLLM_SPECULATIVE_MODES = {"draft_target": "draft_tokens_external", "ngram": "draft_tokens_external",
                            "medusa": "medusa", "eagle": "eagle", "lookahead": "lookahead_decoding"}
LOOP_MODES = tuple(m.value for m in Mode if m.loop_in_bls)
BLS_MODES = (*LOOP_MODES, "engine")  # the BLS's speculative_mode parameter
POLICIES = ("adaptive", "fixed")  # draft-length policies (trt_spec/in_triton/draft_policy.py)
PROPOSERS = ("suffix", "prompt_lookup")  # n-gram mode's draft-free proposers


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
