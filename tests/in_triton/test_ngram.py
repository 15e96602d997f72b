"""Prompt-lookup (n-gram) proposals (trt_spec/in_triton/proposers.py NgramDraft)."""

from __future__ import annotations

import pytest

from trt_spec.in_triton.proposers import NgramDraft


def test_proposes_the_continuation_of_the_longest_matching_ngram():
    # Suffix [7, 8, 9] occurred at 0 -> continuation 10, 11, 12, 13.
    seq = [7, 8, 9, 10, 11, 12, 13, 14, 1, 7, 8, 9]
    assert NgramDraft(3, 4).propose(seq) == [10, 11, 12, 13]
    assert NgramDraft(3, 2).propose(seq) == [10, 11]
    assert NgramDraft(3, 4).propose(seq, k=1) == [10]


def test_longer_ngrams_win_over_more_recent_shorter_ones():
    # "5 6" occurs twice; the longer "4 5 6" match (start) beats the more recent bigram match.
    seq = [4, 5, 6, 20, 21, 3, 5, 6, 30, 31, 4, 5, 6]
    assert NgramDraft(3, 2).propose(seq) == [20, 21]
    assert NgramDraft(2, 2).propose(seq) == [30, 31]  # bigrams only: the most recent occurrence


def test_most_recent_match_is_used():
    seq = [1, 2, 50, 1, 2, 60, 61, 1, 2]
    assert NgramDraft(2, 2).propose(seq) == [60, 61]


def test_falls_back_to_shorter_ngrams_down_to_min_ngram():
    seq = [9, 3, 40, 41, 42, 8, 3]  # only the unigram "3" repeats
    assert NgramDraft(3, 3).propose(seq) == [40, 41, 42]
    assert NgramDraft(3, 3, min_ngram=2).propose(seq) == []


def test_no_match_gives_empty_proposal():
    assert NgramDraft(3, 4).propose([1, 2, 3, 4, 5]) == []
    assert NgramDraft(3, 4).propose([1]) == []
    assert NgramDraft(3, 4).propose([]) == []
    assert NgramDraft(3, 0).propose([1, 1, 1]) == []


def test_continuation_is_cut_by_the_end_of_the_sequence():
    # The only earlier match of "5" is right before the suffix: its continuation is just the suffix token.
    assert NgramDraft(1, 4).propose([2, 5, 5]) == [5]
    assert NgramDraft(2, 4).propose([1, 2, 1, 2]) == [1, 2]


def test_never_proposes_past_eos():
    seq = [7, 8, 2, 9, 9, 3, 7, 8]
    assert NgramDraft(2, 4).propose(seq, eos_token_ids={2}) == [2]  # stops at (and includes) EOS
    assert NgramDraft(2, 4).propose(seq, eos_token_ids={9}) == [2, 9]
    assert NgramDraft(2, 4).propose(seq) == [2, 9, 9, 3]


def test_invalid_configuration():
    with pytest.raises(ValueError, match="min_ngram must be >= 1"):
        NgramDraft(3, 4, min_ngram=0)
    with pytest.raises(ValueError, match="max_ngram must be >= min_ngram"):
        NgramDraft(1, 4, min_ngram=2)
    with pytest.raises(ValueError, match="k must be >= 0"):
        NgramDraft(3, -1)
