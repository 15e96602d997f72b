"""Token selection and the accept rule, including statistical exactness of rejection sampling."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
pytestmark = pytest.mark.usefixtures("one_thread")

from trt_spec.reference.accept import speculative_accept, speculative_accept_batch  # noqa: E402
from trt_spec.reference.sampling import logits_to_probs, select  # noqa: E402

# Chi-square critical values at significance 0.001 by degrees of freedom (scipy.stats.chi2.ppf(0.999, df)).
CHI2_CRIT = {1: 10.828, 2: 13.816, 3: 16.266, 4: 18.467, 5: 20.515, 6: 22.458, 7: 24.322}
N = 200_000
V = 8


def chi_square(counts: torch.Tensor, probs: torch.Tensor) -> tuple[float, int]:
    """Pearson statistic of counts against probs and its degrees of freedom; zero-probability cells must be empty."""
    support = probs > 0
    assert counts[~support].sum() == 0, "a token outside the target's support was emitted"
    expected = probs[support] * counts.sum()
    stat = float(((counts[support] - expected) ** 2 / expected).sum())
    return stat, int(support.sum()) - 1


def assert_distributed_as(tokens: torch.Tensor, probs: torch.Tensor) -> None:
    counts = torch.bincount(tokens, minlength=V).double()
    stat, df = chi_square(counts, probs.double())
    assert stat < CHI2_CRIT[df], f"chi2={stat:.1f} >= {CHI2_CRIT[df]} (df={df}): {counts / counts.sum()} vs {probs}"
    # The same samples must be able to reject a distribution 2 points of mass off (power check).
    top, bottom = int(probs.argmax()), int(torch.where(probs > 0, probs, 2.0).argmin())
    shifted = probs.double().clone()
    shifted[top] -= 0.02
    shifted[bottom] += 0.02
    assert chi_square(counts, shifted)[0] > CHI2_CRIT[df]


TARGET_LOGITS = torch.tensor(
    [
        [2.0, 1.0, 0.5, 0.0, -0.5, -1.0, float("-inf"), float("-inf")],  # tokens 6, 7 impossible at position 0
        [0.0, 0.3, 1.5, -1.0, 0.2, 0.9, -0.4, 0.1],
        [1.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0],
    ]
)  # [k + 1 = 3, V]


def run_batch(draft_probs: torch.Tensor | None, drafts: torch.Tensor, temperature=1.0, top_k=0, top_p=1.0, seed=0):
    gen = torch.Generator().manual_seed(seed)
    logits = TARGET_LOGITS.expand(drafts.shape[0], -1, -1)
    probs = None if draft_probs is None else draft_probs.expand(drafts.shape[0], -1, -1)
    return speculative_accept_batch(drafts, probs, logits, temperature, top_k, top_p, gen)


def sample_drafts(q: torch.Tensor, seed=1) -> torch.Tensor:
    """[N, k] drafts, column i drawn from q[i]."""
    gen = torch.Generator().manual_seed(seed)
    return torch.stack([torch.multinomial(row, N, replacement=True, generator=gen) for row in q], 1)


def check_exact(out: torch.Tensor, n: torch.Tensor, p: torch.Tensor, second: bool = True) -> None:
    """First emitted token ~ p[0]; with `second`, the second, in rows that accepted the first draft, ~ p[1]
    (checked on more than 20,000 such rows, enough for the power check)."""
    assert_distributed_as(out[:, 0], p[0])
    two = n >= 1
    if second:
        assert two.sum() > 20_000, f"only {int(two.sum())} rows accepted the first draft"
        assert_distributed_as(out[two, 1], p[1])


@pytest.mark.parametrize("case", ["always", "never", "sometimes", "sometimes_topk"])
def test_rejection_sampling_matches_target_distribution(case):
    temperature, top_k = (0.7, 5) if case == "sometimes_topk" else (1.0, 0)
    p = logits_to_probs(TARGET_LOGITS, temperature, top_k)  # [3, V]
    if case == "always":
        q = p[:2]
    elif case == "never":  # all draft mass on tokens the target never emits at position 0
        q = torch.tensor([[0, 0, 0, 0, 0, 0, 0.5, 0.5], p[1].tolist()])
    else:
        q = torch.softmax(
            torch.tensor([[0.0, 2.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0], [1.0, 0.0, 0.0, 0.0, 2.0, 0.0, 0.0, 0.5]]), -1
        )
    drafts = sample_drafts(q)
    out, n = run_batch(q, drafts, temperature, top_k)
    rate0 = float((n >= 1).double().mean())
    if case == "always":
        assert rate0 > 0.999
    elif case == "never":
        assert rate0 == 0.0
    else:
        assert 0.2 < rate0 < 0.9
        assert float((n == 2).double().mean()) > 0.05  # the bonus-token path is exercised too
    check_exact(out, n, p, second=case != "never")  # "never": no row reaches a second token
    # Accepted drafts are copied verbatim; padding after the emitted tokens is -1.
    assert torch.equal(out[n >= 1, 0], drafts[n >= 1, 0])
    assert (out[n == 0, 1:] == -1).all()


def test_ngram_one_hot_draft_sampling_is_exact():
    """No draft probabilities: q is one-hot on the proposal, accepted with probability p(x)."""
    p = logits_to_probs(TARGET_LOGITS, 1.0)
    drafts = torch.tensor([[0, 2]]).expand(N, 2)  # a fixed n-gram proposal
    out, n = run_batch(None, drafts)
    assert float((n >= 1).double().mean()) == pytest.approx(float(p[0, 0]), abs=0.005)
    check_exact(out, n, p)


def test_single_row_api_is_exact_too():
    """speculative_accept (one row per call): fewer samples, same rule."""
    p = logits_to_probs(TARGET_LOGITS, 1.0)
    q = torch.softmax(torch.tensor([[0.0, 2.0, 0.0, 1.0, 0.0, 0.0, 1.0, 0.0], [0.0] * 8]), -1)
    gen = torch.Generator().manual_seed(3)
    firsts = []
    for _ in range(3000):
        d = torch.multinomial(q, 1, generator=gen)[:, 0]
        tokens, n = speculative_accept(d, q, TARGET_LOGITS, 1.0, generator=gen)
        assert len(tokens) == n + 1 and tokens[:n] == d[:n].tolist()
        firsts.append(tokens[0])
    counts = torch.bincount(torch.tensor(firsts), minlength=V).double()
    stat, df = chi_square(counts, p[0].double())
    assert stat < CHI2_CRIT[df]


def test_greedy_accept_is_argmax_and_uses_no_randomness():
    logits = torch.full((3, V), -1.0)
    logits[0, 3] = logits[1, 5] = logits[2, 7] = 1.0  # argmax 3, 5, 7
    gen = torch.Generator().manual_seed(0)
    state = gen.get_state()
    assert speculative_accept([3, 5], None, logits, 0.0, generator=gen) == ([3, 5, 7], 2)
    assert speculative_accept([3, 4], None, logits, 0.0, generator=gen) == ([3, 5], 1)
    assert speculative_accept([2, 5], None, logits, 0.0, generator=gen) == ([3], 0)
    assert speculative_accept([], None, logits[:1], 0.0, generator=gen) == ([3], 0)
    q = torch.full((2, V), 1.0 / V)  # draft probabilities are ignored when greedy
    assert speculative_accept([3, 5], q, logits, 0.0, generator=gen) == ([3, 5, 7], 2)
    assert torch.equal(gen.get_state(), state)


def test_accept_shapes_are_checked():
    with pytest.raises(ValueError, match=r"k \+ 1"):
        speculative_accept([1, 2], None, torch.zeros(2, V), 0.0)
    with pytest.raises(ValueError, match="draft_probs"):
        speculative_accept([1, 2], torch.zeros(3, V), torch.zeros(3, V), 1.0)


def test_logits_to_probs_filters():
    logits = torch.log(torch.tensor([0.5, 0.3, 0.15, 0.05]))
    torch.testing.assert_close(logits_to_probs(logits, 1.0), torch.tensor([0.5, 0.3, 0.15, 0.05]))
    torch.testing.assert_close(logits_to_probs(logits, 1.0, top_k=2), torch.tensor([0.625, 0.375, 0.0, 0.0]))
    # top_p keeps the smallest prefix whose mass reaches top_p.
    torch.testing.assert_close(logits_to_probs(logits, 1.0, top_p=0.8), torch.tensor([0.625, 0.375, 0.0, 0.0]))
    torch.testing.assert_close(logits_to_probs(logits, 1.0, top_p=0.81), torch.tensor([0.5, 0.3, 0.15, 0.0]) / 0.95)
    torch.testing.assert_close(logits_to_probs(logits, 1.0, top_p=0.1), torch.tensor([1.0, 0.0, 0.0, 0.0]))
    hot = logits_to_probs(logits, 0.5)
    torch.testing.assert_close(hot, torch.softmax(logits / 0.5, -1))
    assert hot[0] > 0.5
    with pytest.raises(ValueError, match="temperature > 0"):
        logits_to_probs(logits, 0.0)
    with pytest.raises(ValueError, match="top_p must be in"):
        logits_to_probs(logits, 1.0, top_p=0.0)
    with pytest.raises(ValueError, match="top_k must be >= 0"):
        logits_to_probs(logits, 1.0, top_k=-1)


def test_select_greedy_and_seeded_sampling():
    logits = torch.tensor([[0.0, 3.0, 1.0], [2.0, 0.0, 1.0]])
    tokens, probs = select(logits, 0.0)
    assert tokens.tolist() == [1, 0] and probs is None
    a, pa = select(logits, 1.0, generator=torch.Generator().manual_seed(5))
    b, _ = select(logits, 1.0, generator=torch.Generator().manual_seed(5))
    assert torch.equal(a, b) and pa.shape == (2, 3)
    many = select(logits[:1].expand(20_000, -1), 1.0, generator=torch.Generator().manual_seed(6))[0]
    freq = torch.bincount(many, minlength=3).double() / many.numel()
    torch.testing.assert_close(freq, torch.softmax(logits[0], -1).double(), atol=0.015, rtol=0)
