"""The BLS's speculative loop (trt_spec/in_triton/speculative_loop.py) against a strict double of the tensorrtllm
backend contract: every engine request it sends must pass the backend's checks, and the output must be the target's."""

import asyncio

import numpy as np
import pytest

from trt_spec.in_triton.speculative_loop import (
    Cancelled,
    EngineError,
    RequestError,
    SpecRequest,
    SpeculativeLoop,
    engine_step_histogram,
    validate,
)
from trt_spec.records import backend_contract as bc
from trt_spec.records.bls_parameters import BlsParameters

from ..engine_double import END_ID, ContractEngine, Router, draft_next, target_next

LIMITS = bc.EngineLimits(
    max_batch_size=4,
    max_seq_len=256,
    max_num_tokens=256,
    max_draft_len=4,
    speculative_decoding_mode="draft_tokens_external",
)
PROMPTS = [[5, 9, 11], [7, 7, 7, 7, 3], [40, 41, 42, 43, 44, 45, 46, 47], [12]]


def setup(
    mode="draft_target",
    k_max=4,
    limits=LIMITS,
    draft_limits=None,
    in_engine_accept=0,
    decoupled=True,
    policy="fixed",
    proposer="prompt_lookup",
):
    target = ContractEngine(target_next, limits, in_engine_accept=in_engine_accept, decoupled=decoupled)
    draft = ContractEngine(draft_next, draft_limits or bc.EngineLimits(4, 256, 256), decoupled=decoupled)
    cfg = BlsParameters(
        tensorrt_llm_model_name="tensorrt_llm",
        tensorrt_llm_draft_model_name="tensorrt_llm_draft" if mode == "draft_target" else "",
        speculative_mode=mode,
        max_draft_len=k_max,
        num_draft_tokens=k_max,
        ngram_size=3,
        max_seq_len=limits.max_seq_len,
        max_num_tokens=limits.max_num_tokens,  # the engine's input limit: limits.input_limit()
        draft_len_policy=policy,
        proposer=proposer,
        tokenizer_dir="unused",
    )
    assert cfg.engine_input_limit == limits.input_limit()
    return SpeculativeLoop(cfg, Router(tensorrt_llm=target, tensorrt_llm_draft=draft)), target, draft


def run(loop, req):
    chunks = []
    generated, m = asyncio.run(loop.generate(req, chunks.append))
    return generated, m, chunks


def baseline(prompt, n):
    """Target-only greedy decoding through the same strict double (what the ensemble returns)."""
    eng = ContractEngine(target_next, LIMITS)
    ins = {
        "input_ids": np.asarray([prompt], np.int32),
        "input_lengths": np.asarray([[len(prompt)]], np.int32),
        "request_output_len": np.asarray([[n]], np.int32),
        "end_id": np.asarray([[END_ID]], np.int32),
        "exclude_input_in_output": np.asarray([[True]], bool),
    }
    out = eng(ins, list(bc.MANDATORY_OUTPUTS))[0]
    return [int(x) for x in out["output_ids"].reshape(-1)]


def req(prompt, n=24, k=4, **kw):
    return SpecRequest(prompt=list(prompt), max_tokens=n, k=k, end_id=END_ID, pad_id=0, **kw)


@pytest.mark.parametrize("k", [1, 2, 4])
@pytest.mark.parametrize("prompt", PROMPTS)
def test_draft_target_equals_target_only(prompt, k):
    loop, target, draft = setup()
    generated, m, chunks = run(loop, req(prompt, 24, k))
    assert generated == baseline(prompt, 24)
    assert [t for c in chunks for t in c] == generated  # streaming chunks add up to the output
    assert all(1 <= len(c) <= k + 1 for c in chunks) and len(chunks) == m.steps
    # the histogram counts the rounds that verified drafts (not the last one-token round with nothing to draft)
    assert sum(m.hist) == sum(1 for x in m.rounds if x.drafted) and m.accepted == sum(
        i * n for i, n in enumerate(m.hist)
    )
    assert len(m.rounds) == m.steps and m.draft_lengths == [x.k for x in m.rounds]
    assert 0 < m.accepted <= m.drafted
    if k == 4:
        assert m.accepted < m.drafted  # the draft agrees often, not always
    # every engine request asked for both mandatory outputs and sent no sampling inputs it was not given
    for ins, outs in target.requests + draft.requests:
        assert set(bc.MANDATORY_OUTPUTS) <= set(outs)
        assert not {"temperature", "runtime_top_k", "runtime_top_p"} & set(ins)
    # verification requests: request_output_len = len(draft) + 1, drafts within max_draft_len
    for ins, _ in target.requests:
        d = ins.get("draft_input_ids")
        n = 0 if d is None else d.size
        assert n <= k and int(ins["request_output_len"][0, 0]) == n + 1


def test_ngram_equals_target_only_and_drafts_from_the_sequence():
    loop, target, _ = setup("ngram", k_max=4)
    prompt = [5, 9, 11, 5, 9, 11, 5, 9]
    generated, m, _ = run(loop, req(prompt, 30, 4))
    assert generated == baseline(prompt, 30)
    assert m.drafted > 0 and len(target.requests) == m.steps


@pytest.mark.parametrize("mode", ["draft_target", "ngram"])
def test_the_end_token_ends_the_request_and_is_not_output(mode):
    """The engine does not output end_id (backend_contract.EOS_EXCLUDED): the loop must see the end in a short
    round and stop there, neither missing it (running on to max_tokens) nor adding the token itself."""
    loop, target, _ = setup(mode)
    generated, m, _ = run(loop, req([20, 21], 200, 4))
    assert END_ID not in generated and len(generated) < 200
    assert generated == baseline([20, 21], 200)
    assert len(target.requests) == m.steps  # no round after the end


def test_stop_word_cuts_the_output():
    loop, _, _ = setup()
    full = baseline(PROMPTS[0], 24)
    stop = full[6:8]
    generated, _, chunks = run(loop, req(PROMPTS[0], 24, 4, stop_words=[stop]))
    assert generated == full[:8] and [t for c in chunks for t in c] == generated


def test_sampling_inputs_forwarded_only_when_sent():
    loop, target, draft = setup()
    sampling = {"temperature": np.asarray([[0.0]], np.float32)}
    run(loop, req(PROMPTS[0], 8, 2, sampling=sampling))
    for ins, _ in target.requests + draft.requests:
        assert "temperature" in ins and "runtime_top_k" not in ins and "runtime_top_p" not in ins


def test_more_draft_tokens_than_the_engine_takes_is_refused_with_the_executors_text():
    limits = bc.EngineLimits(4, 256, 256, max_draft_len=2, speculative_decoding_mode="draft_tokens_external")
    loop, _, _ = setup(k_max=4, limits=limits)  # a BLS configured beyond what the engine was built for
    with pytest.raises(EngineError, match=r"Draft tokens length \(4\) exceeds maximum draft tokens length \(2\)"):
        run(loop, req(PROMPTS[0], 16, 4))


def test_sequences_past_the_input_limit_are_refused_before_any_engine_call():
    limits = bc.EngineLimits(4, 256, 64, max_draft_len=4, speculative_decoding_mode="draft_tokens_external")
    loop, target, _ = setup(limits=limits)
    with pytest.raises(
        RequestError, match=r"prompt \+ max_tokens - 1 \(66 tokens\) exceeds the engine's input limit 64"
    ):
        validate(loop.cfg, 3, 64, 4, False)
    # without the check the engine would refuse the request mid-generation (what the check prevents)
    with pytest.raises(EngineError, match=r"Prompt length \(65\) exceeds maximum input length \(64\)"):
        run(loop, req([30] * 3, 100, 4))
    assert target.requests  # it got that far: rounds ran before the failure


def test_request_validation_is_one_line_each():
    loop, _, _ = setup()
    for args, msg in [
        ((0, 8, 2, False), "text_input is empty"),
        ((3, 0, 2, False), "max_tokens must be >= 1"),
        ((3, 300, 2, False), "exceeds max_seq_len 256"),
        ((3, 8, 9, False), "outside 0..max_draft_len"),
        ((3, 8, -1, False), "outside 0..max_draft_len"),
    ]:
        with pytest.raises(RequestError, match=msg) as e:
            validate(loop.cfg, *args)
        assert "\n" not in str(e.value)
    ngram, _, _ = setup("ngram")
    with pytest.raises(RequestError, match="use_draft_logits needs draft-target mode"):
        validate(ngram.cfg, 3, 8, 2, True)


@pytest.mark.parametrize("stream", [False, True])
def test_in_engine_modes_send_one_request_for_the_whole_generation(stream):
    loop, target, _ = setup("engine", k_max=63, in_engine_accept=2)
    generated, m, chunks = run(loop, req(PROMPTS[2], 30, 0, stream=stream))
    assert generated == baseline(PROMPTS[2], 30)
    assert len(target.requests) == 1
    ins, outs = target.requests[0]
    assert int(ins["request_output_len"][0, 0]) == 30 and bool(ins["streaming"][0, 0]) == stream
    assert bool(ins["return_perf_metrics"][0, 0]) and set(bc.MANDATORY_OUTPUTS) <= set(outs)
    assert m.drafted > 0 and m.accepted > 0 and m.steps == len(generated) - m.accepted
    if stream:
        assert len(chunks) > 1 and [t for c in chunks for t in c] == generated


@pytest.mark.parametrize("stream", [False, True])
def test_in_engine_modes_stream_the_engine_for_a_histogram_that_adds_up_with_its_totals(stream):
    """stream_engine (a decoupled deployment): the engine call streams whether or not the client does, and its steps
    make the histogram, which adds up with the engine's totals; without it a non-streamed request gets none."""
    for stream_engine in (True, False):
        loop, target, _ = setup("engine", k_max=4, in_engine_accept=2)
        loop = SpeculativeLoop(loop.cfg, loop.call, stream_engine=stream_engine)
        generated, m, _ = run(loop, req(PROMPTS[2], 30, 0, stream=stream))
        assert generated == baseline(PROMPTS[2], 30)
        assert bool(target.requests[0][0]["streaming"][0, 0]) == (stream or stream_engine)
        if not (stream or stream_engine):
            assert m.hist == []
            continue
        # the double: every response one step of 2 accepted drafts + 1, the last cut to what max_tokens leaves
        assert len(m.hist) == 5 and m.hist[2] == 10 and sum(m.hist) == 10
        assert sum(j * h for j, h in enumerate(m.hist)) == m.accepted and m.drafted == 2 * sum(m.hist)


def test_the_engine_step_histogram_counts_steps_with_drafts_or_none():
    # context (1 token, no drafts), steps accepting 2, 0 and 3 of 4, a plain decode step, the last cut by the end
    ok = [(1, 0, 0), (3, 4, 2), (1, 8, 2), (4, 12, 5), (1, 12, 5), (2, 16, 8)]
    assert engine_step_histogram(ok, 4, streamed=True) == [1, 0, 1, 2, 0]
    assert engine_step_histogram(ok, 4, streamed=False) == []  # one response sums every step
    assert engine_step_histogram([(1, 0, 0), (4, 8, 2)], 4, True) == []  # two steps in one response
    assert engine_step_histogram([(1, 0, 0), (1, 4, 2), (3, 8, 4)], 4, True) == []  # a cut step before the end
    assert engine_step_histogram([(1, 0, 0), (6, 5, 5)], 4, True) == []  # more accepted than k
    assert engine_step_histogram([(1, 0, 0), (2, 0, 1)], 4, True) == []  # accepted without drafts
    assert engine_step_histogram([], 4, True) == [0] * 5  # nothing drafted: all zero, as vLLM answers


def test_the_double_is_as_strict_as_the_backend():
    eng = ContractEngine(target_next, LIMITS, decoupled=False)
    ins = {
        "input_ids": np.asarray([[5, 6]], np.int32),
        "input_lengths": np.asarray([[2]], np.int32),
        "request_output_len": np.asarray([[4]], np.int32),
    }
    with pytest.raises(bc.ContractError, match="sequence_length tensor must be present in list of output tensors"):
        eng(ins, ["output_ids"])
    with pytest.raises(bc.ContractError, match="Streaming is only supported if model is deployed using decoupled mode"):
        eng({**ins, "streaming": np.asarray([[True]])}, list(bc.MANDATORY_OUTPUTS))
    with pytest.raises(bc.ContractError, match="request_output_len is not present"):
        eng({k: v for k, v in ins.items() if k != "request_output_len"}, list(bc.MANDATORY_OUTPUTS))
    with pytest.raises(bc.ContractError, match="beamWidth"):
        eng({**ins, "beam_width": np.asarray([[2]], np.int32)}, list(bc.MANDATORY_OUTPUTS))
    with pytest.raises(bc.ContractError, match="num_return_sequences 3"):
        eng({**ins, "num_return_sequences": np.asarray([[3]], np.int32)}, list(bc.MANDATORY_OUTPUTS))
    ok = eng({**ins, "beam_width": np.asarray([[1]], np.int32)}, list(bc.MANDATORY_OUTPUTS))[0]
    # non-streaming output_ids include the prompt unless excluded; sequence_length counts this response
    assert ok["output_ids"].shape == (1, 1, 6) and ok["output_ids"][0, 0, :2].tolist() == [5, 6]
    assert ok["sequence_length"].tolist() == [[6]]


def test_a_cancelled_request_stops_between_rounds():
    loop, target, draft = setup()
    rounds_before_cancel = 3
    calls = []

    def cancelled():
        calls.append(1)
        return len(calls) > rounds_before_cancel

    chunks = []
    with pytest.raises(Cancelled, match="cancelled after"):
        asyncio.run(loop.generate(req(PROMPTS[0], 60, 4), chunks.append, cancelled))
    assert len(target.requests) == rounds_before_cancel  # no engine call once cancelled
    assert len(chunks) == rounds_before_cancel


def test_a_cancelled_in_engine_stream_stops_at_the_next_response():
    """In-engine modes make one streamed call: the cancellation is checked at each streamed response and raises
    there (the BLS then cancels the engine call where the python backend can), so nothing more is emitted."""
    loop, target, _ = setup("engine", k_max=63, in_engine_accept=2)
    chunks = []
    with pytest.raises(Cancelled, match="cancelled after"):
        asyncio.run(loop.generate(req(PROMPTS[2], 30, 0, stream=True), chunks.append, lambda: len(chunks) >= 2))
    assert len(chunks) == 2 and len(target.requests) == 1


def test_prompt_over_the_deployments_max_input_len_is_refused():
    cfg = BlsParameters(
        tensorrt_llm_model_name="t",
        speculative_mode="ngram",
        max_draft_len=4,
        num_draft_tokens=4,
        ngram_size=3,
        draft_len_policy="adaptive",
        proposer="suffix",
        max_seq_len=256,
        max_num_tokens=256,  # the engine's input limit: min(256 - 1, 256) = 255
        max_input_len=100,
        tokenizer_dir="unused",
    )
    assert cfg.engine_input_limit == 255
    validate(cfg, 100, 8, 4, False)
    with pytest.raises(RequestError, match="prompt is 101 tokens, more than max_input_len 100"):
        validate(cfg, 101, 8, 4, False)


# -- the adaptive draft-length policy in the loop ---------------------------------------------------------------------
class TimedRouter(Router):
    """The router with engine latencies (seconds) on a modelled clock: each call advances `now` by its cost, so the
    policy measures exactly these costs whatever the machine's load, and they add up in `spent`. Target: a call
    overhead plus a decode step per token generated without drafts, or one step plus a little per draft token to
    verify; draft: per token drafted."""

    def __init__(self, **engines):
        super().__init__(**engines)
        self.spent = 0.0

    def now(self) -> float:
        return self.spent

    async def __call__(self, model, inputs, outputs, on_response=None):
        n = int(inputs["request_output_len"][0, 0])
        if model == "tensorrt_llm_draft":
            cost = 0.0005 + 0.0008 * n
        elif "draft_input_ids" in inputs:
            cost = 0.002 + 0.004 + 0.0005 * inputs["draft_input_ids"].size
        else:
            cost = 0.002 + 0.004 * n
        self.spent += cost
        await asyncio.sleep(0)
        return await super().__call__(model, inputs, outputs, on_response)


def timed_setup(mode, policy, draft_fn=draft_next, proposer="suffix"):
    loop, target, _ = setup(mode, policy=policy, proposer=proposer)
    draft = ContractEngine(draft_fn, bc.EngineLimits(4, 256, 256))
    loop.call = TimedRouter(tensorrt_llm=target, tensorrt_llm_draft=draft)
    loop.clock = loop.call.now
    return loop


@pytest.mark.parametrize("mode,proposer", [("draft_target", "suffix"), ("ngram", "suffix"), ("ngram", "prompt_lookup")])
def test_adaptive_policy_keeps_the_target_output(mode, proposer):
    loop = timed_setup(mode, "adaptive", proposer=proposer)
    for prompt in PROMPTS:
        generated, m, chunks = run(loop, req(prompt, 60, 4))
        assert generated == baseline(prompt, 60)
        assert [t for c in chunks for t in c] == generated
        assert m.draft_lengths == [x.k for x in m.rounds] and all(0 <= k <= 4 for k in m.draft_lengths)
        assert m.drafted == sum(x.drafted for x in m.rounds) and m.accepted == sum(x.accepted for x in m.rounds)
        assert sum(x.tokens for x in m.rounds) >= len(generated)


def test_adaptive_policy_stops_speculating_with_a_draft_that_never_agrees():
    def wrong(seq):
        return (target_next(seq) + 1) % 50

    spent = {}
    for policy in ("fixed", "adaptive"):
        loop = timed_setup("draft_target", policy, draft_fn=wrong)
        generated, m, _ = run(loop, req(PROMPTS[2], 90, 4))
        assert generated == baseline(PROMPTS[2], 90)
        spent[policy] = loop.call.spent
        if policy == "adaptive":
            # runs without speculation make most of the output, each twice as long as the one before (a probe
            # between them re-measures the draft, with the shortest draft: every length costs the same tokens)
            runs = [x.tokens for x in m.rounds if x.k == 0]
            assert sum(runs) > 0.8 * len(generated), m.draft_lengths
            assert runs[:5] == [1, 2, 4, 8, 16]
            # the first round's call also read the prompt, so it measures nothing: the second drafts at the cap too
            assert m.draft_lengths[:2] == [4, 4] and all(x.k == 1 for x in m.rounds[2:] if x.drafted)
    decode_only = 0.002 + 0.004 * 90  # the target alone, one call
    assert spent["adaptive"] < 0.6 * spent["fixed"]
    assert spent["adaptive"] < 1.35 * decode_only, spent


def test_return_perf_metrics_sums_the_engines_perf_outputs_over_the_rounds():
    """NVIDIA's BLS declares the backend's ten perf outputs; the loop asks every engine call for them when the client
    sends return_perf_metrics and sums them over the rounds: KV blocks over every call (draft and target), arrival
    and first-scheduled of the first call, first token of the first target call, last token of the last one."""
    loop, target, draft = setup()
    calls = []

    async def stamped(model, inputs, outputs, on_response=None):  # each call: its own perf values, as the backend
        out = await Router(tensorrt_llm=target, tensorrt_llm_draft=draft)(model, inputs, outputs, on_response)
        n = len(calls) + 1
        calls.append(model)
        for o in out:
            if "kv_cache_alloc_total_blocks" in o:
                o.update(
                    {
                        "kv_cache_alloc_new_blocks": np.asarray([[1]], np.int32),
                        "kv_cache_reused_blocks": np.asarray([[2]], np.int32),
                        "kv_cache_alloc_total_blocks": np.asarray([[3]], np.int32),
                        "arrival_time_ns": np.asarray([[100 * n]], np.int64),
                        "first_scheduled_time_ns": np.asarray([[100 * n + 1]], np.int64),
                        "first_token_time_ns": np.asarray([[100 * n + 2]], np.int64),
                        "last_token_time_ns": np.asarray([[100 * n + 3]], np.int64),
                    }
                )
        return out

    loop.call = stamped
    generated, m = asyncio.run(loop.generate(req(PROMPTS[0], 24, 4, perf=True), lambda new: None))
    assert generated == baseline(PROMPTS[0], 24)
    assert all(
        bc.RETURN_PERF_METRICS in ins and set(bc.PERF_OUTPUTS) <= set(outs)
        for eng in (target, draft)
        for ins, outs in eng.requests
    )
    perf = {k: v.item() for k, v in m.perf_outputs().items()}
    assert set(perf) == set(bc.PERF_OUTPUTS)
    n = len(calls)
    first_target, last_target = calls.index("tensorrt_llm") + 1, n - calls[::-1].index("tensorrt_llm")
    assert perf["kv_cache_alloc_new_blocks"] == n and perf["kv_cache_reused_blocks"] == 2 * n
    assert perf["kv_cache_alloc_total_blocks"] == 3 * n and calls[0] == "tensorrt_llm_draft"
    assert perf["arrival_time_ns"] == 100 and perf["first_scheduled_time_ns"] == 101
    assert perf["first_token_time_ns"] == 100 * first_target + 2 and perf["last_token_time_ns"] == 100 * last_target + 3
    assert perf["total_draft_tokens"] == m.drafted and perf["total_accepted_draft_tokens"] == m.accepted
    # without the flag no engine call asks for them (the backend then writes none)
    loop2, target2, draft2 = setup()
    run(loop2, req(PROMPTS[0], 24, 4))
    assert not any(bc.RETURN_PERF_METRICS in ins for eng in (target2, draft2) for ins, _ in eng.requests)


class ModelledRouter(Router):
    """The router on a modelled clock: a verification of n tokens costs 1 + per_token·(n − 1), a run of m tokens m."""

    def __init__(self, per_token: float, **engines):
        super().__init__(**engines)
        self.per_token, self.t = per_token, 0.0

    def clock(self) -> float:
        return self.t

    async def __call__(self, model, inputs, outputs, on_response=None):
        if "draft_input_ids" in inputs:
            self.t += 1.0 + self.per_token * inputs["draft_input_ids"].size
        else:
            self.t += float(inputs["request_output_len"][0, 0])
        return await super().__call__(model, inputs, outputs, on_response)


def test_the_suffix_proposals_length_follows_the_measured_verify_cost():
    """`--policy adaptive`: how much of a proposal is verified comes from the costs the loop measured. Flat
    verification (a GPU) verifies every proposal whole, up to the cap; a costly one verifies less where acceptance is
    uncertain. The output is the target's either way. (`fixed` verifies every proposal whole whatever the costs:
    tests/in_triton/test_proposer_replay.py.)"""
    out = {}
    for per_token in (0.0, 0.6):
        loop, target, _ = setup("ngram", policy="adaptive", proposer="suffix")
        router = ModelledRouter(per_token, tensorrt_llm=target)
        loop.__init__(loop.cfg, router, clock=router.clock)
        rounds = []
        for prompt in PROMPTS * 2:
            generated, m, _ = run(loop, req(prompt, 60, 4))
            assert generated == baseline(prompt, 60)
            rounds += m.rounds[1:]  # the first round measures nothing
        out[per_token] = rounds
    flat, costly = out[0.0], out[0.6]
    # tokens verified per token generated: flat verification takes the proposals; at 0.6 of a decode step per
    # extra token, uncertain ones do not pay and most rounds become runs
    share = lambda rs: sum(r.drafted for r in rs) / sum(r.tokens for r in rs)  # noqa: E731
    assert share(flat) > 5 * share(costly)
    assert all(0 <= r.drafted <= 4 for r in flat + costly)
