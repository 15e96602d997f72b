"""`trt-spec check` on FP8-GPU numerics, offline: the speculative path verifies drafts in context-phase forwards, which
are not bit-identical to the baseline's one-token decode steps, so greedy outputs may part at near-ties. The check
measures that noise on the engine that serves the baseline (its generation rows against teacher-forced context-phase
probes), probes it at the divergence: near-ties within the measured margin are reported apart with their top-2 margins
and pass; a wider flip or a real mismatch (a broken accept rule) still fails.

The deployment is a tiny reference build, loaded in process (harness.inprocess.load_deployment: the stand-ins behind
the backend contract and the BLS's own loop); InProcessClient gives check_greedy the client surface it uses. The
GPU-numerics mode is switched on as a server would get it: TRT_SPEC_GPU_NUMERICS in the loading process's environment.
"""

from __future__ import annotations

import asyncio
import zlib

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from trt_spec.harness import identity  # noqa: E402
from trt_spec.harness.client import ClientError, Generation, LLMClient  # noqa: E402
from trt_spec.harness.identity import check_greedy, classify, format_check  # noqa: E402
from trt_spec.harness.inprocess import baseline_call, load_deployment, speculative_call  # noqa: E402
from trt_spec.harness.prompts import Prompt  # noqa: E402
from trt_spec.harness.report import markdown  # noqa: E402
from trt_spec.in_triton.speculative_loop import EngineError, SpecRequest, SpeculativeLoop, engine_inputs  # noqa: E402
from trt_spec.records import backend_contract as bc  # noqa: E402
from trt_spec.records.defaults import ADD_SPECIAL_TOKENS, GPU_NUMERICS_ENV, NEAR_TIE_MARGIN  # noqa: E402
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
        self.generated: list[str] = []

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

    def engine_generation(self, model, input_ids, n):
        """As LLMClient.engine_generation asks the engine: n tokens, non-streamed, return_generation_logits."""
        self.generated.append(model)
        r = SpecRequest(list(input_ids), n, 0, -1, self.d.pad_id)
        ins = engine_inputs(r, list(input_ids), n, 0)
        ins[bc.RETURN_GENERATION_LOGITS] = np.asarray([[True]], dtype=bool)
        try:
            out = asyncio.run(self.d.engines(model, ins, [*bc.MANDATORY_OUTPUTS, bc.GENERATION_LOGITS]))
        except EngineError as e:
            raise ClientError(str(e)) from None
        last = out[-1]
        logits = last[bc.GENERATION_LOGITS]
        return [int(t) for t in last[bc.OUTPUT_IDS].reshape(-1)], logits.reshape(-1, logits.shape[-1])

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


def test_gpu_numerics_flips_are_near_ties_and_pass_on_the_measured_margin(deployment):
    """The mode perturbs context-phase rows (the baseline's prefill, every verification, the probe) and keeps decode
    steps exact, as a GPU's kernels differ: check's noise floor sees that noise, and with no --margin the flips it
    causes on the speculative path pass as near-ties. The probe at a divergence is a context-phase forward of the
    same position, so it sees what the verification saw: the speculative token is its best."""
    c = deployment(f"{FLIP_MARGIN},1")
    rep = check_greedy(c, PROMPTS, tokenizer=c.d.tokenizer)
    assert rep.margin_source.startswith("measured") and rep.near_tie_margin == rep.measured_margin
    assert FLIP_MARGIN / 8 < rep.noise_floor["max"] < FLIP_MARGIN, rep.noise_floor  # |top-2 gap shift| < the width
    assert rep.near_ties >= 1, "the GPU-numerics mode flipped nothing: raise FLIP_MARGIN"
    assert rep.real_mismatches == 0 and rep.passed, format_check(rep)
    for r, p in zip(rep.results, PROMPTS):
        d = r.divergence
        if d is None:
            continue
        assert d.kind == "near-tie" and d.probe == TARGET  # draft-target: the target engine serves the baseline
        assert d.gap < rep.near_tie_margin and d.gap < FLIP_MARGIN  # a flip by the noise is within its width
        base = c.generate(BASELINE, p.text, p.max_tokens).output_ids
        prefix = list(c.d.tokenizer.encode(p.text, add_special_tokens=ADD_SPECIAL_TOKENS)) + base[: d.index]
        probe = c.engine_logits(TARGET, prefix)
        assert int(np.argmax(probe)) == d.speculative_token
    assert set(c.probed) == {TARGET}
    text = format_check(rep)
    assert "near-ties (pass" in text and "NEAR-TIE: DIVERGED at token" in text and "top-2 margin" in text
    assert "verdict: PASS" in text and "(measured: " in text
    report = rep.to_dict()
    assert report["near_tie_margin"] == report["measured_margin"] and report["near_ties"] == rep.near_ties
    assert any(r["divergence"] and r["divergence"]["gap"] is not None for r in report["results"])
    md = markdown({"check": [report], "environment": {"time": "now"}})
    assert "| in-process | near-tie |" in md and "top-2 margin" in md


def test_a_broken_accept_rule_still_fails(deployment, monkeypatch):
    """An accept rule that takes every draft token (never the argmax test) is a real mismatch: the drafted token trails
    the baseline engine's best by far more than the measured margin, which with GPU numerics is as wide as the flips
    the mode causes (they pass, above). It fails with or without GPU numerics, and under --margin FLIP_MARGIN."""
    from trt_spec.reference import batching

    def accept_all(draft, draft_logits, logits, sampling):
        return list(draft) + [int(logits[len(draft)].argmax())], len(draft)

    monkeypatch.setattr(batching, "accept_draft", accept_all)
    for numerics, margin in ((None, None), (f"{FLIP_MARGIN},1", None), (f"{FLIP_MARGIN},1", FLIP_MARGIN)):
        c = deployment(numerics)
        rep = check_greedy(c, PROMPTS, tokenizer=c.d.tokenizer, near_tie_margin=margin)
        assert rep.margin_source.startswith("--margin" if margin else "measured"), rep.margin_source
        if numerics and not margin:
            assert rep.measured_margin > FLIP_MARGIN / 4  # the floor saw the mode's noise
        assert not rep.passed and rep.real_mismatches >= 1, format_check(rep)
        worst = max(r.divergence.gap for r in rep.results if r.divergence and r.divergence.kind == "mismatch")
        assert worst > rep.near_tie_margin
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

    def engine_generation(model, ids, n):
        raise ClientError(f"{model}: logits request failed (unreachable)")

    monkeypatch.setattr(c, "engine_generation", engine_generation)
    rep = check_greedy(c, [Prompt("p", 3)], tokenizer=_Tok())
    assert asked == [(BASELINE_ENGINE, [1, 7, 8, 10, 11])]
    d = rep.results[0].divergence
    assert d.kind == "near-tie" and d.probe == BASELINE_ENGINE and abs(d.margin - 0.01) < 1e-5 and rep.passed
    # nothing measured: the stated fallback, and why
    assert rep.measured_margin is None and rep.near_tie_margin == NEAR_TIE_MARGIN
    assert rep.margin_source.startswith("fallback") and "unreachable" in rep.margin_source
    assert rep.to_dict()["measured_margin"] is None and "noise floor: not measured" in format_check(rep)


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


def test_a_flip_wider_than_the_measured_noise_fails_and_margin_overrides_it(deployment, monkeypatch):
    """With no --margin, check measures the baseline engine's noise floor at a bounded number of positions (its own
    generation-phase logits against a teacher-forced context-phase probe) and classifies with SAFETY x that floor.
    Here the engine runs the GPU-numerics mode at MODE logits, and the speculative path's verification strays further
    (FLIP_MARGIN logits more, numerics the baseline engine's own phases never show): those flips are wider than the
    measured margin and fail; given as --margin they are near-ties. The report carries measured_margin for gpu-smoke
    to record."""
    from trt_spec.records.defaults import NOISE_FLOOR_POSITIONS, NOISE_FLOOR_SAFETY
    from trt_spec.reference import batching

    mode = FLIP_MARGIN / 8
    accept = batching.accept_draft

    def wider(draft, draft_logits, logits, sampling):
        g = torch.Generator().manual_seed(zlib.crc32(np.asarray(draft, dtype=np.int64).tobytes()))
        return accept(
            draft, draft_logits, logits + (torch.rand(logits.shape, generator=g) - 0.5) * FLIP_MARGIN, sampling
        )

    monkeypatch.setattr(batching, "accept_draft", wider)
    c = deployment(f"{mode},1")
    rep = check_greedy(c, PROMPTS, tokenizer=c.d.tokenizer)
    nf = rep.noise_floor
    assert nf["positions"] == NOISE_FLOOR_POSITIONS and nf["engine"] == TARGET
    assert 1e-3 < nf["median"] <= nf["max"] < mode, nf  # the mode's noise, which moves a top-2 gap by < its width
    assert rep.measured_margin == NOISE_FLOOR_SAFETY * nf["max"] == rep.near_tie_margin
    assert rep.margin_source.startswith("measured")
    divergences = [r.divergence for r in rep.results if r.divergence]
    mismatches = [d for d in divergences if d.kind == "mismatch"]
    assert mismatches and all(d.gap > rep.near_tie_margin for d in mismatches), format_check(rep)
    # bounded: one generation request per prompt used, one probe per position and per divergence
    assert len(c.probed) == NOISE_FLOOR_POSITIONS + len(divergences) and len(c.generated) <= NOISE_FLOOR_POSITIONS
    report = rep.to_dict()
    assert report["measured_margin"] == rep.measured_margin and report["verdict"] == "FAIL"
    assert report["probed_gaps"]["count"] == len(divergences)
    text = format_check(rep)
    assert "noise floor: max" in text and "measured margin" in text and "probed gaps at" in text

    wide = FLIP_MARGIN + 2 * mode  # a flip by both noises is within their widths, seen through the mode's
    again = check_greedy(c, PROMPTS, tokenizer=c.d.tokenizer, near_tie_margin=wide)
    assert again.passed and again.near_ties == len(divergences) and again.margin_source == "--margin"
    assert again.measured_margin == pytest.approx(rep.measured_margin, abs=1e-6)  # measured all the same


class _Text:
    """An LLM-API model's answers: text only, re-tokenized one character per token."""

    eos_token_id = 0

    def encode(self, text, add_special_tokens=True):
        return [ord(ch) for ch in text]

    def decode(self, ids):
        return "".join(map(chr, ids))


def test_an_llmapi_divergence_is_unverified_not_passed_nor_failed(monkeypatch):
    """runtime llmapi returns no logits (upstream-facts: llmapi-no-logprobs): a divergence is reported unverified with
    its position and both continuations as text, the verdict is UNVERIFIED (exit 3); a real failure still wins."""
    c = LLMClient("127.0.0.1:1", "grpc")
    c.llmapi = True
    answers = {BASELINE: " return a + b", "tensorrt_llm_bls": " return a - b"}
    monkeypatch.setattr(
        c, "generate", lambda model, text, n, **kw: Generation(answers[model], _Text().encode(answers[model]), 0, 0, 1)
    )
    monkeypatch.setattr(c, "engine_logits", lambda *a: pytest.fail("an LLM-API deployment has no engine to probe"))
    rep = check_greedy(c, [Prompt("def add(a, b):", 16)], tokenizer=_Text())
    d = rep.results[0].divergence
    assert (
        d.kind == "unverified" and d.index == 10 and d.margin is None and "LLM-API model returns text only" in d.probe
    )
    assert (d.baseline_text, d.speculative_text) == ("+ b", "- b")
    assert (rep.unverified, rep.real_mismatches, rep.verdict, rep.exit_code, rep.passed) == (
        1,
        0,
        "UNVERIFIED",
        3,
        False,
    )
    assert rep.noise_floor is None and rep.to_dict()["measured_margin"] is None
    text = format_check(rep)
    assert "unverified (no logits" in text and "UNVERIFIED: DIVERGED at token 10" in text and "'+ b'" in text
    assert text.splitlines()[-1] == (
        "verdict: UNVERIFIED (0 real mismatch(es), 0 near-tie(s), 1 unverified, 0 distribution failure(s))"
    )
    rep.distribution.append({"passed": False, "temperature": 1.0, "chi2": 50.0, "dof": 3, "p_value": 0.0, "samples": 9})
    assert (rep.verdict, rep.exit_code) == ("FAIL", 1)


def test_margin_takes_a_value_or_a_previous_reports_measurement(tmp_path):
    from trt_spec.harness.commands import parse_margin

    assert parse_margin("0.125") == (0.125, "--margin 0.125")
    report = tmp_path / "check.json"
    report.write_text('{"measured_margin": 0.0625, "verdict": "PASS"}')
    assert parse_margin(str(report)) == (0.0625, f"--margin {report}: measured there")
    for bad, words in (
        ("0", "logits > 0"),
        ("nan", "logits > 0"),
        (str(tmp_path / "missing.json"), "not a number and not a readable file"),
    ):
        with pytest.raises(ClientError, match=words):
            parse_margin(bad)
    report.write_text('{"measured_margin": null}')
    with pytest.raises(ClientError, match="carries no measured_margin"):
        parse_margin(str(report))
