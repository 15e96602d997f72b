"""The one speculative loop (the BLS's, trt_spec/in_triton/speculative_loop.py) over real tiny models on the reference
engine, in process: every engine call goes through the stand-in's contract and its batching scheduler, as in
Triton and in `bench in-process`. The output must be the target's own (plain greedy, tests/reference/oracle.py)."""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("one_thread")

from trt_spec.in_triton.local_engines import LocalEngines  # noqa: E402
from trt_spec.in_triton.speculative_loop import SpecRequest, SpeculativeLoop  # noqa: E402
from trt_spec.records import backend_contract as bc  # noqa: E402
from trt_spec.records.bls_parameters import BlsParameters  # noqa: E402
from trt_spec.records.names import DRAFT, TARGET  # noqa: E402
from trt_spec.reference.model import ReferenceModel  # noqa: E402
from trt_spec.reference.standin import StandIn  # noqa: E402

from .oracle import plain_greedy  # noqa: E402

PROMPTS = [[5, 17, 99, 3, 42, 8, 8, 61, 12, 40], [120, 7, 33], [64]]
MAX_SEQ_LEN = 256
# What repository.writer writes for an engine model, as far as the backend reads it at load
PARAMS = {
    "gpt_model_type": "inflight_fused_batching",
    "gpt_model_path": "(in memory)",
    "enable_kv_cache_reuse": "true",
    "enable_chunked_context": "false",
    "tokenizer_dir": "",
    "xgrammar_tokenizer_info_path": "",
    "guided_decoding_backend": "",
}


class Served:
    """A draft-target or n-gram deployment of in-memory models: stand-ins for the engines, the BLS's loop over them."""

    def __init__(
        self, target, draft=None, *, mode="draft_target", k=4, policy="fixed", proposer="prompt_lookup", numerics=None
    ):
        def standin(name, model, draft_len):
            limits = bc.EngineLimits(
                4,
                MAX_SEQ_LEN,
                MAX_SEQ_LEN,
                draft_len,
                speculative_decoding_mode="draft_tokens_external" if draft_len else None,
                vocab_size=model.config.vocab_size,
                gather_generation_logits=True,
            )  # use_logits: as use_draft_logits builds the draft
            return StandIn(name, model, limits, PARAMS, numerics=numerics)

        standins = {TARGET: standin(TARGET, target, k)}
        if draft is not None:
            standins[DRAFT] = standin(DRAFT, draft, 0)
        self.engines = LocalEngines(standins)
        self.loop = SpeculativeLoop(
            BlsParameters(
                tensorrt_llm_model_name=TARGET,
                tensorrt_llm_draft_model_name=DRAFT if draft is not None else "",
                speculative_mode=mode,
                max_draft_len=k,
                num_draft_tokens=k,
                ngram_size=3,
                max_seq_len=MAX_SEQ_LEN,
                max_num_tokens=MAX_SEQ_LEN,  # the engine's input limit: bc.max_input_len(MAX_SEQ_LEN, MAX_SEQ_LEN)
                draft_len_policy=policy,
                proposer=proposer,
                tokenizer_dir="(in memory)",
            ),
            self.engines,
        )

    def run(self, prompt, n, k, *, end_id=-1, stop_words=(), sampling=None, seed=None, use_logits=False):
        """(tokens, loop metrics) of one request; sampling: engine tensors by name (absent: greedy)."""
        r = SpecRequest(
            list(prompt),
            n,
            k,
            end_id,
            0,
            sampling={
                name: np.asarray([[v]], dtype=np.float32 if isinstance(v, float) else np.int32)
                for name, v in (sampling or {}).items()
            },
            seed=seed,
            stop_words=[list(w) for w in stop_words],
            use_logits=use_logits,
        )
        return asyncio.run(self.loop.generate(r, lambda new: None))

    def close(self):
        self.engines.close()


@pytest.fixture
def served():
    made = []

    def make(*a, **kw):
        made.append(Served(*a, **kw))
        return made[-1]

    yield make
    for s in made:
        s.close()


@pytest.fixture(scope="module")
def same(checkpoints):
    return ReferenceModel.from_pretrained(checkpoints["llama"][1])


def test_draft_equal_to_target_accepts_everything(target, same, served):
    s = served(target, same)
    for p in PROMPTS:
        tokens, m = s.run(p, 30, 4)
        assert tokens == plain_greedy(target, p, 30)
        assert m.drafted > 0 and m.accepted == m.drafted and m.acceptance_rate == 1.0
        # every round verifies k drafts and yields k + 1 tokens; the last is clamped to the budget (k <= remaining - 1)
        assert [(rd.drafted, rd.tokens) for rd in m.rounds] == [(4, 5)] * 6
        assert m.hist == [0, 0, 0, 0, 6] and m.draft_lengths == [4] * 6


def test_random_draft_is_rejected_and_output_unchanged(target, random_draft, served):
    s = served(target, random_draft)
    drafted = accepted = 0
    for p in PROMPTS:
        tokens, m = s.run(p, 24, 3)
        assert tokens == plain_greedy(target, p, 24)
        drafted, accepted = drafted + m.drafted, accepted + m.accepted
    assert drafted > 30 and accepted / drafted < 0.15


def test_close_draft_accepts_partially(target, close_draft, served):
    s = served(target, close_draft)
    hist = [0] * 5
    drafted = accepted = rounds = 0
    for p in PROMPTS:
        tokens, m = s.run(p, 32, 4)
        assert tokens == plain_greedy(target, p, 32)
        hist = [a + b for a, b in zip(hist, m.hist)]
        drafted, accepted, rounds = (
            drafted + m.drafted,
            accepted + m.accepted,
            rounds + sum(1 for rd in m.rounds if rd.drafted),
        )
    assert 0.2 < accepted / drafted < 0.8
    # the histogram counts speculative rounds (a round without speculation is counted apart)
    assert sum(hist) == rounds and sum(i * c for i, c in enumerate(hist)) == accepted


def test_gpu_numerics_flips_only_near_ties_of_context_phase_forwards(target, same, served):
    """The GPU-numerics mode perturbs each context-phase forward by less than its margin (every target call of the
    draft-target loop is one: a verification is a new request) and keeps one-token decode steps exact. The speculative
    output then leaves plain greedy only where greedy's own top-2 margin is below that margin (a near-tie), and the
    token it takes there is within the margin of the best. The baseline (the target's own decode) leaves it only at its
    first token, the prefill's, where it takes what the loop's first verification takes: the same position gets the
    same noise in every context-phase forward. Off, the output is greedy's exactly."""
    from trt_spec.reference.engine import Sampling
    from trt_spec.reference.numerics import GpuNumerics

    margin = 0.5
    flips = 0

    def within_margin(prefix: list[int], tok: int) -> bool:
        logits = target.forward(
            torch.tensor([prefix]), torch.arange(len(prefix))[None], target.new_cache(1, len(prefix))
        )
        return float(logits[0, -1].max() - logits[0, -1, tok]) < margin

    s = served(target, same, numerics=GpuNumerics(margin, seed=3))
    for p in PROMPTS:
        tokens, _ = s.run(p, 30, 4)
        ref = plain_greedy(target, p, 30)
        i = next((j for j, (a, b) in enumerate(zip(tokens, ref)) if a != b), None)
        if i is not None:
            flips += 1
            assert within_margin(p + ref[:i], tokens[i]), "a flip outside the stated margin"
        base = s.engines.standins[TARGET].scheduler.submit_generate(p, 30, Sampling()).result(60).tokens
        assert base[0] == tokens[0] and within_margin(p, base[0])
        assert base[1:] == plain_greedy(target, p + base[:1], 29), "a decode step was perturbed"
    assert flips > 0, "the perturbation never flipped a verification: raise the margin for this model"
    for p in PROMPTS:  # off: exact
        assert served(target, same).run(p, 30, 4)[0] == plain_greedy(target, p, 30)


def test_end_id_inside_the_draft_stops_like_greedy(target, same, served):
    """The engine does not output end_id (backend_contract.EOS_EXCLUDED); the loop stops where greedy meets it."""
    ref = plain_greedy(target, PROMPTS[0], 30)
    idx = next(i for i in range(6, 30) if i % 5 in (1, 2, 3) and ref[i] not in ref[:i])
    for draft, mode in ((same, "draft_target"), (None, "ngram")):
        tokens, _ = served(target, draft, mode=mode).run(PROMPTS[0], 30, 4, end_id=ref[idx])
        assert tokens == ref[:idx]


def test_stop_words_end_the_output(target, same, served):
    ref = plain_greedy(target, PROMPTS[1], 30)
    stop = ref[9:11]
    first = next(i for i in range(len(ref) - 1) if ref[i : i + 2] == stop)
    tokens, _ = served(target, same).run(PROMPTS[1], 30, 4, stop_words=[[127, 126, 125], stop])
    assert tokens == ref[: first + 2]  # the stop word is kept


@pytest.mark.parametrize("max_new", [1, 2, 3, 5, 6, 7])
def test_budget_boundary_with_k_larger_than_remaining(target, same, served, max_new):
    tokens, m = served(target, same, k=8).run(PROMPTS[0], max_new, 8)
    assert tokens == plain_greedy(target, PROMPTS[0], max_new)
    # never more drafts than the remaining budget - 1: one round covers the whole budget
    assert m.drafted == max_new - 1 and m.steps == 1


@pytest.mark.parametrize("proposer", ["prompt_lookup", "suffix"])
def test_ngram_equals_greedy_and_accepts(target, served, proposer):
    s = served(target, mode="ngram", proposer=proposer)
    accepted = 0
    for p in PROMPTS:
        tokens, m = s.run(p, 40, 4)
        assert tokens == plain_greedy(target, p, 40)
        accepted += m.accepted
    assert accepted > 0


def test_a_verification_is_one_forward_over_the_new_token_and_the_drafts(target, close_draft, served, monkeypatch):
    """The prefix cache keeps every round's accepted positions: a verification feeds only the token the target chose
    last and the k drafts, in one forward (the first round also feeds the prompt)."""
    fed = []
    inner = target.forward_packed

    def forward_packed(tokens, positions, segments, logits_at):
        fed.append(int(tokens.shape[0]))
        return inner(tokens, positions, segments, logits_at)

    monkeypatch.setattr(target, "forward_packed", forward_packed)
    tokens, m = served(target, close_draft).run(PROMPTS[0], 21, 4)
    assert tokens == plain_greedy(target, PROMPTS[0], 21)
    assert len(fed) == m.steps
    assert fed[0] == len(PROMPTS[0]) + m.rounds[0].drafted
    assert fed[1:] == [rd.drafted + 1 for rd in m.rounds[1:]]


def test_sampling_is_seeded_and_a_self_draft_is_accepted(target, same, served):
    s = served(target, same, k=3)
    sampling = {"temperature": 0.8, "runtime_top_k": 50, "runtime_top_p": 0.95}
    a = s.run(PROMPTS[0], 20, 3, sampling=sampling, seed=123, use_logits=True)
    b = s.run(PROMPTS[0], 20, 3, sampling=sampling, seed=123, use_logits=True)
    c = s.run(PROMPTS[0], 20, 3, sampling=sampling, seed=124, use_logits=True)
    assert a[0] == b[0] and a[0] != c[0] and len(a[0]) == 20
    assert a[1].acceptance_rate > 0.95  # q == p up to float rounding of a 1- vs 4-token forward
