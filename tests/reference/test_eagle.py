"""EAGLE-3 in the reference engine: the head's checkpoint layout, training (reproducible, it learns), and in-engine
speculation through the scheduler and the stand-in: greedy output identical to plain greedy (tests/reference/oracle.py),
sampling distributed exactly as the target's, streaming per step, end token / stop words / budget inside a step,
batching, prefix reuse, cancellation, and the backend's outputs for the request's flags."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("one_thread")

from trt_spec.records import backend_contract as bc  # noqa: E402
from trt_spec.reference import train_eagle as te  # noqa: E402
from trt_spec.reference.batching import BatchScheduler  # noqa: E402
from trt_spec.reference.eagle import Eagle3Head, default_aux_layers  # noqa: E402
from trt_spec.reference.engine import ReferenceEngine, Sampling  # noqa: E402
from trt_spec.reference.sampling import logits_to_probs  # noqa: E402
from trt_spec.reference.standin import EAGLE_HEAD_MISSING, StandIn  # noqa: E402

from .oracle import plain_greedy  # noqa: E402
from .test_sampling import chi_square  # noqa: E402

PROMPTS = [[5, 17, 99, 3, 42, 8, 8, 61, 12, 40], [120, 7, 33], [64]]
K = 4
PARAMS = {
    "gpt_model_type": "inflight_fused_batching",
    "gpt_model_path": "(in memory)",
    "enable_kv_cache_reuse": "true",
    "enable_chunked_context": "false",
    "tokenizer_dir": "",
    "xgrammar_tokenizer_info_path": "",
    "guided_decoding_backend": "",
}
EAGLE3_NAMES = {
    "fc.weight",
    "norm.weight",
    "lm_head.weight",
    "d2t",
    "t2d",
    "midlayer.input_layernorm.weight",
    "midlayer.hidden_norm.weight",
    "midlayer.post_attention_layernorm.weight",
    *(f"midlayer.self_attn.{p}_proj.weight" for p in "qkvo"),
    *(f"midlayer.mlp.{p}_proj.weight" for p in ("gate", "up", "down")),
}


def new_head(model, vocab_ids=None) -> Eagle3Head:
    return te.new_head(model, torch.arange(model.config.vocab_size) if vocab_ids is None else vocab_ids, 0)


def train_on_target(model, *, steps=300, seed=0, draft_vocab=96):
    """A head trained on the target's own greedy continuations of PROMPTS and 45 random prompts (train_eagle's
    pieces). A random tiny target's next token is a random function of its context, which no small head generalises
    to; trained on the test prompts' continuations, the head shows that the mechanism accepts what it learned.
    (Generalisation is measured on SmolLM2 and held-out prompts: docs/measurements.md.)"""
    gen = torch.Generator().manual_seed(1234)
    prompts = [
        *PROMPTS,
        *(
            torch.randint(3, model.config.vocab_size, (int(n),), generator=gen).tolist()
            for n in torch.randint(2, 12, (45,), generator=gen)
        ),
    ]
    aux = default_aux_layers(model.config.num_layers)
    data = te.generate_labelled(model, prompts, aux, max_new=40, end_id=None, batch=16, log=lambda m: None)
    seqs, labelled = [s for s, _, _ in data], [(f, t) for _, f, t in data]
    ids = te.draft_vocabulary([t for _, t in labelled], model.config.vocab_size, draft_vocab)
    to_draft = torch.full((model.config.vocab_size,), -100, dtype=torch.long)
    to_draft[ids] = torch.arange(len(ids))
    cfg = te.TrainConfig(Path("."), Path("."), steps=steps, seq_len=32, batch=8, lr=3e-3, seed=seed)
    rows = te.make_rows(seqs, labelled, to_draft, seq_len=cfg.seq_len, ttt=cfg.ttt)
    head = te.new_head(model, ids, seed)
    losses = te.train(cfg, head, model.embed, rows, lambda m: None)
    return head, losses


@pytest.fixture(scope="module")
def trained(target):
    return train_on_target(target)


def scheduler(model, head, *, k=K, reuse=False, max_seq_len=256, policy="fixed"):
    eng = ReferenceEngine(
        model,
        max_seq_len,
        prefix_cache_bytes=(1 << 26) if reuse else 0,
        head=head,
        max_draft_len=k,
        draft_policy=policy,
    )
    return BatchScheduler(eng, max_batch_size=4, max_num_tokens=512)


def test_checkpoint_is_the_eagle3_layout_and_loads_back(target, trained, tmp_path):
    from safetensors.torch import load_file

    head, _ = trained
    head.save(tmp_path / "h", {"max_position_embeddings": 1024})
    names = set(load_file(str(tmp_path / "h" / "model.safetensors")))
    assert names == EAGLE3_NAMES
    cfg = json.loads((tmp_path / "h" / "config.json").read_text())
    assert cfg["architectures"] == ["LlamaForCausalLMEagle3"] and cfg["num_hidden_layers"] == 1
    assert cfg["draft_vocab_size"] == head.cfg.draft_vocab_size < cfg["vocab_size"] == target.config.vocab_size
    assert cfg["eagle_config"]["eagle_aux_hidden_state_layer_ids"] == list(default_aux_layers(target.config.num_layers))
    back = Eagle3Head.load(tmp_path / "h")
    for name, t in head.state_dict().items():
        assert torch.equal(back.state_dict()[name], t), name
    # d2t maps draft ids to target ids (target = draft + d2t[draft]); t2d marks the same target ids
    assert torch.equal(torch.nonzero(back.t2d).flatten(), back.target_ids)


def test_training_learns_and_is_reproducible(target, trained):
    head, losses = trained
    assert sum(losses[-10:]) / 10 < 0.6 * sum(losses[:10]) / 10
    one, losses1 = train_on_target(target, steps=15)
    again, losses2 = train_on_target(target, steps=15)  # the same seed: the same head (up to the BLAS's rounding)
    assert losses2 == pytest.approx(losses1, rel=1e-4)
    for (name, a), b in zip(one.state_dict().items(), again.state_dict().values()):
        assert torch.allclose(a.float(), b.float(), atol=1e-4), name
    other, _ = train_on_target(target, seed=1, steps=15)
    assert not torch.allclose(other.fc.weight, one.fc.weight, atol=1e-4)


@pytest.mark.parametrize("max_new", [1, 2, 5, 33])
def test_greedy_output_is_the_targets_with_a_trained_and_an_untrained_head(target, trained, max_new):
    heads = {"trained": trained[0], "untrained": new_head(target)}
    for (name, head), policy in zip(heads.items(), ("adaptive", "fixed")):
        with scheduler(target, head, policy=policy) as sch:
            for prompt in PROMPTS:
                res = sch.submit_generate(prompt, max_new, Sampling()).result()
                assert res.tokens == plain_greedy(target, prompt, max_new), (name, prompt)
                assert res.accepted <= res.drafted


def test_a_trained_head_is_accepted_where_it_learned_the_target(target, trained):
    rates = {}
    for name, head in (("trained", trained[0]), ("untrained", new_head(target))):
        with scheduler(target, head) as sch:
            results = [sch.submit_generate(p, 40, Sampling()).result() for p in PROMPTS]
        drafted, accepted = sum(r.drafted for r in results), sum(r.accepted for r in results)
        rates[name] = accepted / drafted
    assert rates["trained"] > 0.25 and rates["untrained"] < 0.05, rates


def test_end_token_and_stop_words_inside_a_step_end_like_greedy(target, trained):
    prompt = PROMPTS[0]
    greedy = plain_greedy(target, prompt, 30)
    end = greedy[7]
    with scheduler(target, trained[0]) as sch:
        res = sch.submit_generate(prompt, 30, Sampling(), end_id=end).result()
        assert res.tokens == plain_greedy(target, prompt, 30, end_id=end)
        stop = greedy[4:6]
        res = sch.submit_generate(prompt, 30, Sampling(), stop_words=[stop]).result()
        cut = next(i for i in range(2, 31) if greedy[i - 2 : i] == stop)
        assert res.tokens == greedy[:cut]


def test_streaming_sends_each_steps_tokens_and_batches_match_solo(target, trained):
    steps: list[list[int]] = []
    with scheduler(target, trained[0]) as sch:
        handles = [
            sch.submit_generate(p, 24, Sampling(), on_tokens=steps.append if i == 0 else None)
            for i, p in enumerate(PROMPTS)
        ]
        results = [h.result() for h in handles]
    for p, r in zip(PROMPTS, results):
        assert r.tokens == plain_greedy(target, p, 24)
    assert [t for s in steps for t in s] == results[0].tokens
    assert max(len(s) for s in steps) > 1  # a step that accepted drafts streams them together


def test_prefix_reuse_keeps_the_output_and_cancel_stops_between_steps(target, trained):
    with scheduler(target, trained[0], reuse=True) as sch:
        first = sch.submit_generate(PROMPTS[0], 20, Sampling()).result()
        second = sch.submit_generate(PROMPTS[0] + first.tokens[:5], 15, Sampling()).result()
        assert second.reused_tokens > 0
        assert second.tokens == plain_greedy(target, PROMPTS[0] + first.tokens[:5], 15)
        calls = []
        stopped = sch.submit_generate(PROMPTS[1], 60, Sampling(), should_stop=lambda: calls.append(1) or True).result()
    assert stopped.cancelled and 1 <= len(stopped.tokens) <= K + 1 and len(calls) == 1


@pytest.mark.parametrize("policy", ["adaptive", "fixed"])
def test_a_finished_request_leaves_the_head_caught_up_so_its_prefix_is_reused_whole(target, trained, policy):
    """A one-token request (the context step only: the head never ran) and a request that ends in a run without
    speculation leave target features the head has not consumed; without catching the head up at the end, the next
    request on that prefix re-fed the target from the head's first stale slot (measured served: the whole prompt)."""
    prompt = PROMPTS[0]
    with scheduler(target, trained[0], reuse=True, policy=policy) as sch:
        sch.submit_generate(prompt, 1, Sampling()).result()
        again = sch.submit_generate(prompt, 12, Sampling()).result()
        assert again.reused_tokens == len(prompt) - 1  # all but the last token, which is always re-fed
        assert again.tokens == plain_greedy(target, prompt, 12)
        longer = prompt + again.tokens
        more = sch.submit_generate(longer, 8, Sampling()).result()
        assert more.reused_tokens == len(longer) - 1
        assert more.tokens == plain_greedy(target, longer, 8)


def test_sampling_is_distributed_exactly_as_the_target(target, trained):
    """The first two tokens of a sampled generation (top-k 3: 9 cells) against the target's own joint distribution;
    the second token comes from a verified draft most of the time, so this is the head's rejection sampling."""
    prompt = PROMPTS[1]
    n = 3000
    rule = dict(temperature=1.0, top_k=3)
    with scheduler(target, trained[0], k=2) as sch:
        handles = [sch.submit_generate(prompt, 3, Sampling(**rule, seed=i)) for i in range(n)]
        results = [h.result() for h in handles]
    assert sum(r.accepted for r in results) > n // 20  # drafts were verified and accepted, not only resampled

    def probs(seq):
        return logits_to_probs(
            target.forward(torch.tensor([seq]), torch.arange(len(seq))[None], target.new_cache(1, len(seq)))[0, -1],
            **rule,
        )

    p1 = probs(prompt)
    first = torch.nonzero(p1).flatten().tolist()
    cells, expected = {}, []
    for a in first:
        p2 = probs(prompt + [a])
        for b in torch.nonzero(p2).flatten().tolist():
            cells[(a, b)] = len(expected)
            expected.append(float(p1[a] * p2[b]))
    counts = torch.zeros(len(expected), dtype=torch.float64)
    for r in results:
        counts[cells[tuple(r.tokens[:2])]] += 1
    stat, df = chi_square(counts, torch.tensor(expected, dtype=torch.float64))
    assert df == 8 and stat < 26.124, (stat, counts / n, expected)  # chi2.ppf(0.999, 8)


def standin(model, head, *, k=K):
    limits = bc.EngineLimits(4, 256, 256, k, speculative_decoding_mode="eagle", vocab_size=model.config.vocab_size)
    return StandIn("tensorrt_llm", model, limits, PARAMS, head=head, draft_policy="fixed")


def test_standin_refuses_an_eagle_engine_without_head_and_reports_drafts(target, trained):
    with pytest.raises(bc.ContractError, match="no EAGLE-3 head"):
        standin(target, None)
    assert "EAGLE-3 head" in EAGLE_HEAD_MISSING
    s = standin(target, trained[0])
    try:
        inputs = {
            bc.INPUT_IDS: np.asarray([PROMPTS[0]], dtype=np.int32),
            bc.INPUT_LENGTHS: np.asarray([[len(PROMPTS[0])]], dtype=np.int32),
            bc.REQUEST_OUTPUT_LEN: np.asarray([[24]], dtype=np.int32),
            bc.RETURN_PERF_METRICS: np.asarray([[True]]),
        }
        req = s.parse(inputs, [*bc.MANDATORY_OUTPUTS, *bc.SPEC_PERF_OUTPUTS])
        res = s.submit(req).result()
        out = s.final(req, res)
        ids = out[bc.OUTPUT_IDS].reshape(-1).tolist()  # prompt + output, as the backend answers a unary request
        assert ids == PROMPTS[0] + plain_greedy(target, PROMPTS[0], 24)
        drafted = int(out["total_draft_tokens"].reshape(-1)[0])
        accepted = int(out["total_accepted_draft_tokens"].reshape(-1)[0])
        assert drafted > 0 and 0 < accepted <= drafted
        assert float(out["acceptance_rate"].reshape(-1)[0]) == pytest.approx(accepted / drafted)
    finally:
        s.close()


def test_heldout_prompts_share_nothing_with_the_training_prompts():
    from trt_spec.harness.prompts import PROMPT_SETS, load_prompts
    from trt_spec.reference.distill import EVAL_CHAT_PROMPTS, TRAIN_CHAT_PROMPTS

    data = Path(__file__).resolve().parents[1] / "data"
    held = [p.text for name in ("chat_heldout.jsonl", "code_heldout.jsonl") for p in load_prompts(str(data / name))]
    assert len(held) == 24
    train = set(te.TRAIN_PROMPTS)
    shipped = {p.text for ps in PROMPT_SETS.values() for p in ps}
    for text in held:
        assert text not in train | shipped | set(TRAIN_CHAT_PROMPTS) | set(EVAL_CHAT_PROMPTS)
    for text in shipped:
        assert text not in train
    # no training prompt asks for the same function as a held-out one
    stems = {t.split(" that ", 1)[1].rstrip(".") for t in held if " that " in t}
    assert not any(s in t for s in stems for t in train)


def test_drafting_computes_exactly_what_training_time_test_trained(target, trained):
    """Drafting j tokens past position t (head_step over the context's slots, then its own outputs) gives the logits the
    training forward gives for step j at position t: the same attention (context slots <= t, then the chain's own
    slots), the same positions, the same fed-back hidden state."""
    from trt_spec.reference.eagle import HeadState, head_step

    head = trained[0]
    seq = plain_greedy(target, PROMPTS[0], 12)
    full = PROMPTS[0] + seq
    n = len(full)
    aux = head.cfg.aux_layers
    cache = target.new_cache(1, n + 1)
    _, feats = target.forward_packed(torch.tensor(full), torch.arange(n), [(cache, n)], torch.arange(n), aux_layers=aux)
    T = n - 4  # head positions 0..T-1; steps j read x_{t+1+j}
    emb = [target.embed[torch.tensor(full[1 + j : 1 + j + T])][None] for j in range(3)]
    with torch.no_grad():
        trained_logits = [o[0] for o in head.train_forward(feats[None, :T], emb)]
    t = T - 1
    state = HeadState.new(head, 64)
    with torch.no_grad():
        h = head_step(head, state, 0, head.fc(feats[:T]), emb[0][0])  # slots 0..t
        assert torch.allclose(head.logits(h[t]), trained_logits[0][t], atol=1e-4)
        g = h[t : t + 1]
        for j in (1, 2):
            g = head_step(head, state, t + j, g, emb[j][0, t : t + 1])
            assert torch.allclose(head.logits(g[0]), trained_logits[j][t], atol=1e-4), j


class ModelledCosts:
    """A deterministic clock for the engine's cost measurements: a forward feeding n tokens advances it by
    forward(n) = 1 + per_token·(n − 1) units and a head step by `head` units, whatever the machine is doing (installed
    on the model's forward and the head step; the engine reads it as its `clock`). It also counts head steps."""

    def __init__(self, monkeypatch, model, *, per_token: float, head: float):
        from trt_spec.reference import batching, eagle

        self.t, self.per_token, self.head, self.head_steps = 0.0, per_token, head, 0
        forward, step = model.forward_packed, eagle.head_step

        def timed_forward(tokens, *args, **kw):
            self.t += self.forward(len(tokens))
            return forward(tokens, *args, **kw)

        def timed_head_step(*args, **kw):
            self.t += self.head
            self.head_steps += 1
            return step(*args, **kw)

        monkeypatch.setattr(model, "forward_packed", timed_forward)
        monkeypatch.setattr(batching, "head_step", timed_head_step)
        monkeypatch.setattr(eagle, "head_step", timed_head_step)

    def forward(self, n: int) -> float:
        return 1.0 + self.per_token * (n - 1)

    def __call__(self) -> float:
        return self.t


def modelled_run(model, head, clock, prompts, max_new, *, policy="adaptive", reuse=False):
    """Generate the prompts one after another on one engine (the deployment's acceptance carries over) -> (results,
    modelled seconds, head steps). Its costs at load are measured with the clock too."""
    eng = ReferenceEngine(
        model,
        512,
        prefix_cache_bytes=(1 << 26) if reuse else 0,
        head=head,
        max_draft_len=K,
        draft_policy=policy,
        clock=clock,
    )
    t0, steps0 = clock.t, clock.head_steps
    with BatchScheduler(eng, max_batch_size=4, max_num_tokens=512) as sch:
        results = [sch.submit_generate(p, max_new, Sampling()).result() for p in prompts]
    return results, clock.t - t0, clock.head_steps - steps0


def plain_cost(clock, prompts, max_new) -> float:
    """Modelled seconds of plain decoding: the prompt's forward, then one forward per further token."""
    return sum(clock.forward(len(p)) + max_new - 1 for p in prompts)


def test_the_chain_measures_its_costs_at_load_as_the_policys_starting_point(target, monkeypatch):
    clock = ModelledCosts(monkeypatch, target, per_token=0.3, head=0.2)
    eng = ReferenceEngine(target, 256, head=new_head(target), max_draft_len=K, clock=clock)
    t = eng.policy.costs.at(1)
    assert t.verify_s(2) == pytest.approx(1.3) and t.verify_s(K + 1) == pytest.approx(clock.forward(K + 1))
    assert t.draft_s(3) == pytest.approx(0.6) and t.decode_s() == pytest.approx(1.0)
    # fixed: nothing to decide, nothing measured; an unknown word is refused
    assert not ReferenceEngine(
        target, 256, head=new_head(target), max_draft_len=K, draft_policy="fixed"
    ).policy.costs.levels
    for word in ("tree", "confidence"):
        with pytest.raises(ValueError, match=rf"eagle_draft_policy '{word}': use one of adaptive, fixed"):
            ReferenceEngine(target, 256, head=new_head(target), max_draft_len=K, draft_policy=word)


def test_a_head_that_loses_falls_to_runs_without_speculation_and_never_costs_more(target, monkeypatch):
    """An untrained head (its drafts are almost never accepted) on a CPU's costs (a verification of k drafts costs
    1 + 0.3k decode steps, a head step 0.2): the adaptive chain falls to runs of plain decode steps that leave the head
    idle, runs that double while the probes between them lose, and costs no more than 3% over plain decoding in the
    modelled time (the fixed chain: about 3x). The output is the target's own greedy output, prefix reuse after a run
    (the head's slots stale for the run's positions) included."""
    clock = ModelledCosts(monkeypatch, target, per_token=0.3, head=0.2)
    head, prompts, n = new_head(target), PROMPTS * 2, 120
    results, seconds, head_steps = modelled_run(target, head, clock, prompts, n)
    for p, r in zip(prompts, results):
        assert r.tokens == plain_greedy(target, p, n)
        speculative = [k for k in r.draft_lengths if k]
        assert r.draft_lengths.count(0) >= len(speculative) >= 1  # runs, each followed by one probe
        plain_steps = n - 1 - sum(a + 1 for _, a in r.rounds)
        assert plain_steps >= 0.9 * n  # decoded without the head
        assert len(r.rounds) <= 8  # probes after runs of 1, 2, 4, ..., 64 tokens
    assert head_steps <= 2 * sum(len(r.rounds) for r in results)  # (a probe: the catch-up step and its chain)
    assert plain_cost(clock, prompts, n) / seconds >= 0.97
    _, fixed_seconds, _ = modelled_run(target, head, clock, PROMPTS[:1], 60, policy="fixed")
    assert plain_cost(clock, PROMPTS[:1], 60) / fixed_seconds < 0.5
    first, _, _ = modelled_run(target, head, clock, PROMPTS[:1], 40, reuse=True)
    cont = PROMPTS[0] + first[0].tokens[:30]
    again, _, _ = modelled_run(target, head, clock, [cont], 20, reuse=True)
    assert again[0].tokens == plain_greedy(target, cont, 20)


def test_a_head_that_pays_keeps_drafting(target, trained, monkeypatch):
    """The trained head where verification costs what a decode step costs (a GPU at small batch): the adaptive chain
    drafts nearly every step, yields more than plain decoding in the modelled time, and the output is the target's."""
    clock = ModelledCosts(monkeypatch, target, per_token=0.0, head=0.05)
    results, seconds, _ = modelled_run(target, trained[0], clock, PROMPTS, 60)
    for p, r in zip(PROMPTS, results):
        assert r.tokens == plain_greedy(target, p, 60)
        assert sum(1 for k in r.draft_lengths if k) >= 0.75 * len(r.draft_lengths)
        assert r.accepted > 0 and len(r.rounds) == sum(1 for k in r.draft_lengths if k)
    assert plain_cost(clock, PROMPTS, 60) / seconds > 1.1
