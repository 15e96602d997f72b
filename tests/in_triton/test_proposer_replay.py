"""The suffix proposer's cost-aware length on a modelled clock (benchmarks/proposer_replay.py): SmolLM2's greedy output
for the held-out code-edit prompts is recorded once per session, then speculation is replayed through the BLS's own
loop with a target that answers from the recording, against vLLM's n-gram lookup and the length rule the proposer had
before. Figures, not tuning: the rules were chosen before these prompts were replayed (docs/draft-policy.md)."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
_spec = importlib.util.spec_from_file_location("proposer_replay", ROOT / "benchmarks" / "proposer_replay.py")
pr = importlib.util.module_from_spec(_spec)
sys.modules["proposer_replay"] = pr
_spec.loader.exec_module(pr)

COST_AWARE, OLD, VLLM = pr.PROPOSERS


@pytest.fixture(scope="session")
def code_edit(tmp_path_factory):
    """The target's greedy continuations of tests/data/code_edit_heldout.jsonl (≈30 s on 2 cores, batched)."""
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    return pr.record(pr.load_set(pr.SETS[0]), tmp_path_factory.mktemp("replay"))


def show(capsys, lines):
    with capsys.disabled():
        print("\n" + "\n".join(lines))


def test_the_vllm_ngram_stand_in_does_what_vllm_documents():
    # vLLM's own example: [4, 2, 3] has no earlier match, [2, 3] has: the (up to k) tokens after it
    assert pr.VllmNgram(k=4, min_n=2, max_n=3).propose([1, 2, 3, 4, 2, 3]) == [4, 2, 3]
    # the longest n first, its earliest occurrence; n = 1 when nothing longer matches
    assert pr.VllmNgram(k=2).propose([1, 2, 9, 1, 2, 8, 1, 2]) == [9, 1]
    assert pr.VllmNgram(k=3).propose([5, 6, 7, 8, 6]) == [7, 8, 6]
    assert pr.VllmNgram().propose([1, 2, 3]) == []


def test_the_old_rule_is_two_tokens_per_matched_token_plus_agreeing_occurrences():
    seq = [7, 8, 9, 10, 11, 12, 13, 14, 1, 7, 8, 9]  # m = 3, one occurrence: ceil(2·3) + 0 tokens
    assert pr.OldRule().propose(seq) == [10, 11, 12, 13, 14, 1]
    two = [1, 2, 30, 31, 32, 33, 9, 1, 2, 30, 31, 32, 33, 8, 1, 2]  # m = 2, two agreeing: 4 + 1 (9 / 8: the latest)
    assert pr.OldRule().propose(two) == [30, 31, 32, 33, 8]


def test_where_verification_is_flat_the_proposer_yields_at_least_vllm_ngrams_tokens_per_call(code_edit, capsys):
    """A GPU at small batch: a target call costs the same for 1 or 9 tokens, so tokens per target call is the speedup.
    The cost-aware length proposes as far as the match goes and yields at least what vLLM's n-gram lookup does."""
    recs, end_id = code_edit
    show(capsys, pr.table(recs, end_id, "code_edit_heldout"))
    f = {name: pr.replay(recs, end_id, name, "flat") for name in (COST_AWARE, OLD, VLLM)}
    assert all(x.identical for x in f.values())  # the output is the target's, whatever was proposed
    assert f[COST_AWARE].per_call >= f[VLLM].per_call
    assert f[COST_AWARE].per_call >= f[OLD].per_call
    assert f[COST_AWARE].mean_len > f[OLD].mean_len  # longer proposals than the old rule's on the same matches
    assert f[COST_AWARE].silent_rounds <= f[OLD].silent_rounds  # it proposes wherever the old rule did


def test_where_verification_costs_per_token_the_modelled_time_per_token_is_not_worse_than_the_old_rule(
    code_edit, capsys
):
    """This CPU: a 9-token verification costs ≈2.3 decode steps. The same proposer under the adaptive policy (the
    default), its length chosen from the costs it measured, spends no more modelled time per token than the fixed
    tokens-per-match rule did, and less than proposing k whatever the match (vLLM's n-gram)."""
    recs, end_id = code_edit
    policy = "adaptive"
    f = {name: pr.replay(recs, end_id, name, "cpu", policy) for name in (COST_AWARE, OLD, VLLM)}
    show(
        capsys,
        [f"cpu, --policy {policy}: " + ", ".join(f"{n} {x.time_per_token:.3f}/token" for n, x in f.items())],
    )
    assert all(x.identical for x in f.values())
    assert f[COST_AWARE].time_per_token <= f[OLD].time_per_token
    assert f[COST_AWARE].time_per_token < f[VLLM].time_per_token


def test_fixed_verifies_the_whole_candidate_whatever_the_costs(code_edit):
    """--policy fixed is the control arm: the proposer's whole candidate (up to k) is verified, so the same requests
    verify the same lengths under flat and under this CPU's costs, whatever the server learned."""
    recs, end_id = code_edit
    flat, cpu = (pr.replay(recs, end_id, COST_AWARE, costs, "fixed") for costs in ("flat", "cpu"))
    assert flat.proposals == cpu.proposals and flat.calls == cpu.calls
