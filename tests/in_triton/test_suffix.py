"""Draft-free suffix proposals (trt_spec/in_triton/proposers.py): exact proposals on hand-made sequences."""

from __future__ import annotations

import random

import pytest

from trt_spec.in_triton.proposers import Candidate, SuffixProposer, SuffixStore, _Index


def test_copies_a_repeated_block_by_the_longest_match_as_far_as_it_goes():
    # Suffix [7, 8, 9] occurred at the start (m = 3): the copy reads on past the block into the sequence's own tail.
    seq = [7, 8, 9, 10, 11, 12, 13, 14, 1, 7, 8, 9]
    c = SuffixProposer(8).candidate(seq)
    assert c.tokens == [10, 11, 12, 13, 14, 1, 7, 8]
    # each token's evidence: the match it extends (one longer per token read on), agreeing and live occurrences
    assert c.evidence == [(m, 1, 1) for m in range(3, 11)]
    assert SuffixProposer(8).propose(seq) == c.tokens


def test_the_more_frequent_continuation_wins_and_the_evidence_says_by_how_much():
    # [1, 2, 3] ends at three earlier places: followed by 9, 9 and (most recently) 7.
    seq = [1, 2, 3, 9, 1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3]
    c = SuffixProposer(8).candidate(seq)
    assert c.tokens == [9, 1, 2, 3, 7, 5, 1, 2]
    # 2 of 3 agree on 9; the two 9-occurrences agree on 1, 2, 3, then split 9 / 7 (the most recent wins a tie)
    assert c.evidence == [(3, 2, 3), (4, 2, 2), (5, 2, 2), (6, 2, 2), (7, 1, 2), (8, 1, 1), (9, 1, 1), (10, 1, 1)]


def test_a_tie_goes_to_the_most_recent_occurrence():
    seq = [1, 2, 3, 9, 1, 2, 3, 7, 5, 1, 2, 3]
    assert SuffixProposer(3).candidate(seq) == Candidate([7, 5, 1], [(3, 1, 2), (4, 1, 1), (5, 1, 1)])
    seq = [1, 2, 3, 7, 1, 2, 3, 9, 5, 1, 2, 3]
    assert SuffixProposer(3).propose(seq) == [9, 5, 1]


def test_a_longer_match_beats_a_more_frequent_shorter_one():
    # [5, 6] is followed by 40 twice, but [4, 5, 6] (once, followed by 20) is the longer match.
    seq = [4, 5, 6, 20, 21, 22, 0, 5, 6, 40, 0, 5, 6, 40, 0, 4, 5, 6]
    assert SuffixProposer(3).propose(seq) == [20, 21, 22]


def test_no_match_gives_empty_proposal():
    p = SuffixProposer(8)
    assert p.propose([1, 2, 3, 4, 5]) == []
    assert p.candidate([1, 2, 3, 1]) == Candidate([], [])  # only a 1-token match, min_match = 2
    assert SuffixProposer(8, min_match=1).propose([1, 2, 3, 1], k=2) == [2, 3]
    assert p.propose([1]) == []
    assert p.propose([]) == []
    assert SuffixProposer(0).propose([1, 2, 1, 2]) == []


def test_cap_at_k_max_and_request_k():
    block = list(range(100, 140))
    seq = block + [1] + block[:20]
    assert SuffixProposer(6).propose(seq) == block[20:26]
    assert SuffixProposer(6).propose(seq, k=3) == block[20:23]
    assert SuffixProposer(6).propose(seq, k=50) == block[20:26]


def test_periodic_tail_continues_its_period():
    c = SuffixProposer(8).candidate([5, 5, 5, 5, 5])
    assert c.tokens == [5] * 8 and [m for m, _, _ in c.evidence] == list(range(4, 12))
    assert SuffixProposer(4).propose([9, 1, 2, 1, 2, 1, 2]) == [1, 2, 1, 2]


def test_stops_at_eos():
    seq = [1, 2, 3, 4, 2, 5, 6, 7, 0, 1, 2, 3, 4]
    assert SuffixProposer(8).propose(seq, eos_token_ids=(2,)) == [2]
    assert SuffixProposer(8).propose(seq) == [2, 5, 6, 7, 0, 1, 2, 3]


def test_earlier_requests_in_the_store_are_used_and_bounded():
    store = SuffixStore(max_sequences=2, anchor_len=2)
    p = SuffixProposer(8, store=store)
    earlier = [11, 12, 13, 14, 15, 16, 17, 18]
    assert p.propose([50, 11, 12, 13]) == []
    store.add(earlier)
    assert p.propose([50, 11, 12, 13]) == [14, 15, 16, 17, 18]
    # The current sequence is more recent than the store: it wins a tie.
    assert p.propose([11, 12, 13, 99, 11, 12, 13], k=3) == [99, 11, 12]
    # Two more sequences evict the oldest.
    store.add([60, 61, 62, 63])
    store.add([70, 71, 72, 73])
    assert len(store) == 2
    assert p.propose([50, 11, 12, 13]) == []
    assert p.propose([1, 70, 71]) == [72, 73]
    # Token bound: the oldest go first; an over-long sequence keeps its tail.
    small = SuffixStore(max_sequences=10, max_tokens=10, anchor_len=2)
    small.add([1, 2, 3, 4, 5, 6])
    small.add([7, 8, 9, 10, 11, 12])
    assert len(small) == 1 and small.num_tokens == 6
    small.add(list(range(200, 230)))
    assert small.num_tokens == 10 and SuffixProposer(8, store=small).propose([0, 220, 221]) == list(range(222, 230))
    assert SuffixProposer(8, store=small).propose([0, 210, 211]) == []


def test_store_recency_between_requests():
    store = SuffixStore(anchor_len=2)
    store.add([1, 2, 3, 30])
    store.add([1, 2, 3, 40])
    assert SuffixProposer(8, store=store).propose([0, 1, 2, 3]) == [40]


def test_incremental_index_equals_fresh_and_is_deterministic():
    rng = random.Random(0)
    seq = [rng.randrange(6) for _ in range(400)]
    grown, twin = SuffixProposer(8), SuffixProposer(8)
    for n in range(1, len(seq) + 1):
        assert grown.propose(seq[:n]) == twin.propose(seq[:n])  # the same calls, the same answers
        assert grown._own.ends == _Index(grown.min_match, seq[:n]).ends  # grown incrementally = built fresh
    # Not an extension (the loop restarted): rebuilt and the running copy forgotten, as a fresh proposer.
    assert grown.propose(seq[:50]) == SuffixProposer(8).propose(seq[:50])


def test_a_tie_goes_to_the_occurrence_where_the_copy_was_running():
    # The answer copies the prompt's first block; then the target edits (55 for 202) and emits 1, which precedes
    # 9 in the block being copied and 7 later on: the copy resumes where it was, not at the most recent 1.
    prompt = [100, 200, 201, 202, 1, 9, 9, 300, 1, 7, 7]
    p = SuffixProposer(8, min_match=1)  # as served (defaults.SUFFIX_MIN_MATCH)
    assert p.propose([*prompt, 200, 201])[:2] == [202, 1]
    assert p.propose([*prompt, 200, 201, 55, 1])[:3] == [9, 9, 300]
    assert SuffixProposer(8, min_match=1).propose([*prompt, 200, 201, 55, 1])[:3] == [
        7,
        7,
        200,
    ]  # no running copy: most recent


def test_on_a_tie_a_token_that_goes_on_beats_an_end_token():
    # [3, 4] was followed by 6 and, more recently, by the end token 2: proposing 2 could yield one token at most.
    seq = [3, 4, 6, 7, 10, 3, 4, 2, 11, 3, 4]
    assert SuffixProposer(8).propose(seq, eos_token_ids=(2,)) == [6, 7, 10, 3, 4, 2]
    assert SuffixProposer(8).propose([3, 4, 2, 11, 3, 4], eos_token_ids=(2,)) == [2]  # the only continuation


@pytest.mark.parametrize("k_max", [1, 3, 8])
def test_proposals_never_exceed_the_cap(k_max):
    rng = random.Random(k_max)
    store = SuffixStore(max_sequences=4, anchor_len=2)
    for _ in range(3):
        store.add([rng.randrange(4) for _ in range(200)])
    p = SuffixProposer(k_max, store=store)
    seq = [rng.randrange(4) for _ in range(300)]
    for n in range(0, len(seq), 7):
        for k in (None, 0, 2, 100):
            out = p.propose(seq[:n], k=k)
            assert len(out) <= (k_max if k is None else min(k_max, k))


def test_validation():
    with pytest.raises(ValueError, match="min_match"):
        SuffixProposer(min_match=0)
    with pytest.raises(ValueError, match="max_match"):
        SuffixProposer(min_match=4, max_match=3)
    with pytest.raises(ValueError, match="k_max"):
        SuffixProposer(-1)
    with pytest.raises(ValueError, match="anchor_len"):
        SuffixProposer(min_match=3, store=SuffixStore(anchor_len=2))
