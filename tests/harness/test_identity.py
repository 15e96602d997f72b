"""`trt-spec check` on FP8-GPU numerics, offline: the speculative path verifies drafts in a forward that is not
bit-identical to the baseline's decode steps, so greedy outputs may part at near-ties. The check probes the engine that
serves the baseline (teacher-forced, return_generation_logits) at the divergence: near-ties are reported apart with
their top-2 margins and pass; a real mismatch (a broken accept rule) still fails.

The deployment is a tiny reference build, loaded in process (harness.inprocess.load_deployment: the stand-ins behind
the backend contract and the BLS's own loop); InProcessClient gives check_greedy the client surface it uses. The
GPU-numerics mode is switched on as a server would get it: TRT_SPEC_GPU_NUMERICS in the loading process's environment.
"""

from __future__ import annotations

import asyncio

import numpy as np
import pytest

pytest.importorskip("torch")
pytest.importorskip("transformers")

from trt_spec.harness import identity  # noqa: E402
from trt_spec.harness.client import ClientError, Generation, LLMClient  # noqa: E402
from trt_spec.harness.identity import check_greedy, classify, format_check  # noqa: E402
from trt_spec.harness.inprocess import baseline_call, load_deployment, speculative_call  # noqa: E402
from trt_spec.harness.prompts import Prompt  # noqa: E402
from trt_spec.harness.report import markdown  # noqa: E402
from trt_spec.in_triton.speculative_loop import EngineError, SpecRequest, SpeculativeLoop, engine_inputs  # noqa: E402
from trt_spec.records import backend_contract as bc  # noqa: E402
from trt_spec.records.defaults import GPU_NUMERICS_ENV, NEAR_TIE_MARGIN  # noqa: E402
from trt_spec.records.names import BASELINE, BASELINE_ENGINE, DRAFT, NUM_DRAFT_TOKENS, TARGET  # noqa: E402

PROMPTS = [
    Prompt(t, 24)
    for t in (
        "def add(a, b):",
        "The quick brown fox",
        "class Stack:",
        "for i in range(10):",
        "Hello, world! What is",
        "import numpy as np",
    )
]
FLIP_MARGIN = 4.0  # logits: the tiny models' margins are O(1), so a GPU-sized 0.05 would flip nothing in 6 prompts


class InProcessClient:
    """What check_greedy calls on an LLMClient, over a reference build loaded in this process."""

    protocol = "in-process"

    def __init__(self, build_dir):
        self.d = load_deployment(build_dir)
        self.loop = SpeculativeLoop(self.d.bls, self.d.engines)
        self.probed: list[str] = []

    def generate(self, model, text, max_tokens, **params) -> Generation:
        ids = list(self.d.tokenizer.encode(text))
        if model == BASELINE:
            tokens = asyncio.run(baseline_call(self.d, ids, max_tokens, self.d.end_id)).tokens
        else:
            k = params.get(NUM_DRAFT_TOKENS, self.d.default_k)
            tokens = asyncio.run(speculative_call(self.d, self.loop, ids, max_tokens, k, self.d.end_id, None)).tokens
        return Generation(self.d.tokenizer.decode(tokens), list(tokens), 0.0, 0.0, 1)

    def baseline_engine(self):
        return self.d.baseline_model

    def engine_logits(self, model, input_ids):
        """As LLMClient.engine_logits asks the engine: one token, return_generation_logits."""
        self.probed.append(model)
        r = SpecRequest(list(input_ids), 1, 0, -1, self.d.pad_id)
        ins = engine_inputs(r, list(input_ids), 1, 0)
        ins[bc.RETURN_GENERATION_LOGITS] = np.asarray([[True]], dtype=bool)
        try:
            out = asyncio.run(self.d.engines(model, ins, [*bc.MANDATORY_OUTPUTS, bc.GENERATION_LOGITS]))
        except EngineError as e:
            raise ClientError(str(e)) from None
        logits = next(o[bc.GENERATION_LOGITS] for o in out if bc.GENERATION_LOGITS in o)
        assert logits.shape[:3] == (1, 1, 1)  # [1, beams, T, V]: the one token's logits
        return logits.reshape(-1)

    def close(self):
        self.d.close()


@pytest.fixture(scope="module")
def build(farm):
    return farm.build("dtm_fixed")


@pytest.fixture
def deployment(build, monkeypatch):
    made = []

    def load(numerics=None):
        if numerics is None:
            monkeypatch.delenv(GPU_NUMERICS_ENV, raising=False)
        else:
            monkeypatch.setenv(GPU_NUMERICS_ENV, numerics)
        made.append(InProcessClient(build))
        return made[-1]

    yield load
    for c in made:
        c.close()


def test_gpu_numerics_flips_are_near_ties_and_pass(deployment):
    c = deployment(f"{FLIP_MARGIN},1")
    rep = check_greedy(c, PROMPTS, tokenizer=c.d.tokenizer, near_tie_margin=FLIP_MARGIN)
    assert rep.near_ties >= 1, "the GPU-numerics mode flipped nothing: raise FLIP_MARGIN"
    assert rep.real_mismatches == 0 and rep.passed, format_check(rep)
    for r in rep.results:
        d = r.divergence
        if d is None:
            continue
        assert d.kind == "near-tie" and d.probe == TARGET  # draft-target: the target engine serves the baseline
        assert d.margin < FLIP_MARGIN and d.gap < FLIP_MARGIN
    assert set(c.probed) == {TARGET}
    text = format_check(rep)
    assert "near-ties (pass" in text and "NEAR-TIE: DIVERGED at token" in text and "top-2 margin" in text
    assert "verdict: PASS" in text
    report = rep.to_dict()
    assert report["near_tie_margin"] == FLIP_MARGIN and report["near_ties"] == rep.near_ties
    assert any(r["divergence"] and r["divergence"]["gap"] is not None for r in report["results"])
    md = markdown({"check": [report], "environment": {"time": "now"}})
    assert "| in-process | near-tie |" in md and "top-2 margin" in md


def test_a_broken_accept_rule_still_fails(deployment, monkeypatch):
    """An accept rule that takes every draft token (never the argmax test) is a real mismatch: the drafted token trails
    the baseline engine's best by far more than the near-tie margin. It fails with or without GPU numerics."""
    from trt_spec.reference import batching

    def accept_all(draft, draft_logits, logits, sampling):
        return list(draft) + [int(logits[len(draft)].argmax())], len(draft)

    monkeypatch.setattr(batching, "accept_draft", accept_all)
    for numerics, margin in ((None, NEAR_TIE_MARGIN), (f"{FLIP_MARGIN},1", FLIP_MARGIN)):
        c = deployment(numerics)
        rep = check_greedy(c, PROMPTS, tokenizer=c.d.tokenizer, near_tie_margin=margin)
        assert not rep.passed and rep.real_mismatches >= 1, format_check(rep)
        worst = max(r.divergence.gap for r in rep.results if r.divergence and r.divergence.kind == "mismatch")
        assert worst > margin
        assert "real mismatches (fail)" in format_check(rep) and "verdict: FAIL" in format_check(rep)


def test_the_probe_needs_an_engine_built_to_gather_logits(deployment):
    """The plan builds only the baseline's engine (and a rejection-sampling draft) with --gather_generation_logits;
    the stand-in refuses logits from any other engine with the executor's error, so a check that probed the wrong
    engine could not classify anything."""
    c = deployment()
    assert c.engine_logits(TARGET, [5, 6, 7]).size == 384  # the tiny model's vocabulary
    with pytest.raises(ClientError, match="gather_generation_logits must be enabled"):
        c.engine_logits(DRAFT, [5, 6, 7])


class _Tok:
    eos_token_id = 2

    def encode(self, text, add_special_tokens=True):
        return [1, 7, 8] if add_special_tokens else [7, 8]

    def decode(self, ids):
        return " ".join(map(str, ids))


def test_in_engine_modes_probe_the_baseline_engine_not_the_speculating_one(monkeypatch):
    """Medusa/EAGLE/lookahead: the ensemble runs tensorrt_llm_baseline; the target speculates inside itself, so its
    logits say nothing about the baseline's numerics. check asks the ensemble's engine step, teacher-forced on prompt
    (with the served special tokens) + the common prefix."""
    c = LLMClient("127.0.0.1:1", "grpc")
    ensemble = {
        "ensemble_scheduling": {
            "step": [{"model_name": "preprocessing"}, {"model_name": BASELINE_ENGINE}, {"model_name": "postprocessing"}]
        }
    }
    monkeypatch.setattr(c, "model_config", lambda model: ensemble)
    outputs = {BASELINE: [10, 11, 12], "tensorrt_llm_bls": [10, 11, 13]}
    monkeypatch.setattr(c, "generate", lambda model, text, n, **kw: Generation("", outputs[model], 0, 0, 1))
    asked = []

    def engine_logits(model, ids):
        asked.append((model, ids))
        x = np.zeros(20, np.float32)
        x[12], x[13] = 5.0, 4.99  # a near-tie at the divergence
        return x

    monkeypatch.setattr(c, "engine_logits", engine_logits)
    rep = check_greedy(c, [Prompt("p", 3)], tokenizer=_Tok())
    assert asked == [(BASELINE_ENGINE, [1, 7, 8, 10, 11])]
    d = rep.results[0].divergence
    assert d.kind == "near-tie" and d.probe == BASELINE_ENGINE and abs(d.margin - 0.01) < 1e-5 and rep.passed


def test_classify_uses_both_tokens_distance_to_the_best():
    x = np.array([0.0, 3.0, 2.99, 1.0])
    assert classify(x, [1, 2], 0.05)[0] == "near-tie"
    kind, margin, gap = classify(x, [1, 3], 0.05)  # top-2 close, but the speculative token is far: broken, not numerics
    assert kind == "mismatch" and abs(margin - 0.01) < 1e-6 and abs(gap - 2.0) < 1e-6
    assert classify(x, [1, None], 0.05)[0] == "mismatch"
    assert identity.NEAR_TIE_MARGIN == NEAR_TIE_MARGIN  # one source: records.defaults


def test_the_default_margin_follows_the_probed_engines_backend():
    """0.25 logits is an allowance for FP8 GPU kernels; the CPU stand-in's numerics are exact, so a python-backend
    engine gets NEAR_TIE_MARGIN_EXACT (a broken accept rule within 0.25 of the best must still fail there)."""
    from trt_spec.harness.identity import default_near_tie_margin
    from trt_spec.records.defaults import NEAR_TIE_MARGIN_EXACT

    class Meta:
        def __init__(self, platform):
            self.platform = platform

        def model_metadata(self, model):
            if self.platform is None:
                raise OSError("unreachable")
            return {"name": model, "platform": self.platform}

    assert default_near_tie_margin(Meta("python"), "tensorrt_llm") == NEAR_TIE_MARGIN_EXACT < 0.01
    assert default_near_tie_margin(Meta("tensorrtllm"), "tensorrt_llm") == NEAR_TIE_MARGIN == 0.25
    assert default_near_tie_margin(Meta(None), "tensorrt_llm") == NEAR_TIE_MARGIN
    x = np.array([0.0, 3.0, 2.9, 1.0])  # a token 0.1 below the best: a near-tie on a GPU, a defect on the stand-in
    assert classify(x, [1, 2], NEAR_TIE_MARGIN)[0] == "near-tie"
    assert classify(x, [1, 2], NEAR_TIE_MARGIN_EXACT)[0] == "mismatch"
