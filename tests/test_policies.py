"""Commit policies and schedules: invariants on random inputs and brute-force definitions."""

import pytest
import torch

from unmask.sampler.policy import (
    BudgetPolicy,
    EntropyBoundPolicy,
    FactorPolicy,
    FixedPolicy,
    ThresholdPolicy,
)
from unmask.compat import DreamSchedule
from unmask.sampler.schedule import EvenSchedule


def _batch(seed, B=6, W=12):
    g = torch.Generator().manual_seed(seed)
    score = torch.rand(B, W, generator=g, dtype=torch.float64)
    cand = torch.rand(B, W, generator=g) < 0.6
    cand[0] = False  # a row with no candidates
    cand[1] = True
    entropy = torch.rand(B, W, generator=g, dtype=torch.float64) * 0.2
    quota = torch.randint(1, 5, (B,), generator=g)
    return score, cand, entropy, quota


POLICIES = [FixedPolicy(), ThresholdPolicy(0.7), FactorPolicy(1.0), EntropyBoundPolicy(0.1), BudgetPolicy(1.0)]


@pytest.mark.parametrize("policy", POLICIES, ids=lambda p: type(p).__name__)
@pytest.mark.parametrize("seed", range(20))
def test_commits_are_candidates_and_at_least_one(policy, seed):
    score, cand, entropy, quota = _batch(seed)
    commit = policy.select(score, entropy, cand, quota, 0, None)
    assert commit.dtype == torch.bool and commit.shape == cand.shape
    assert not (commit & ~cand).any()
    has = cand.any(-1)
    assert (commit.sum(-1)[has] >= 1).all()
    assert commit[0].sum() == 0


@pytest.mark.parametrize("seed", range(20))
def test_fixed_takes_quota_most_confident(seed):
    score, cand, _, quota = _batch(seed)
    commit = FixedPolicy().select(score, None, cand, quota, 0, None)
    for b in range(score.shape[0]):
        n = int(cand[b].sum())
        k = min(int(quota[b]), n)
        assert int(commit[b].sum()) == k
        if k:
            rest = score[b][cand[b] & ~commit[b]]
            assert rest.numel() == 0 or score[b][commit[b]].min() >= rest.max()


@pytest.mark.parametrize("seed", range(20))
def test_threshold_all_above_plus_best(seed):
    score, cand, _, _ = _batch(seed)
    commit = ThresholdPolicy(0.7).select(score, None, cand, None, 0, None)
    for b in range(score.shape[0]):
        if not cand[b].any():
            continue
        expect = cand[b] & (score[b] >= 0.7)
        best = torch.where(cand[b], score[b], -1.0).argmax()
        expect[best] = True
        assert commit[b].tolist() == expect.tolist()


def _factor_reference(conf, factor):
    """Fast-dLLM's loop for one row of candidate confidences."""
    n = len(conf)
    if n == 0:
        return 0
    threshs = [1 - factor / (k + 1) for k in range(1, n + 1)]
    threshs[0] = -1
    s = sorted(conf, reverse=True)
    for top_i in range(n):
        if s[top_i] < threshs[top_i]:
            break
    if top_i == 0 or top_i == n - 1:
        top_i += 1
    return top_i


@pytest.mark.parametrize("factor", [0.5, 1.0, 2.0, 4.0])
@pytest.mark.parametrize("seed", range(15))
def test_factor_matches_upstream_loop(factor, seed):
    score, cand, _, _ = _batch(seed)
    score = score ** 0.2  # confident enough that the rule commits more than one
    commit = FactorPolicy(factor).select(score, None, cand, None, 0, None)
    for b in range(score.shape[0]):
        assert int(commit[b].sum()) == _factor_reference(score[b][cand[b]].tolist(), factor)


def test_factor_edge_cases():
    p = FactorPolicy(1.0)
    two = torch.tensor([[0.01, 0.02]], dtype=torch.float64)
    assert p.select(two, None, torch.ones_like(two, dtype=torch.bool), None, 0, None).sum() == 2
    # only the last candidate fails its bound: still committed (upstream quirk)
    c = torch.tensor([[0.99, 0.99, 0.1]], dtype=torch.float64)
    assert p.select(c, None, torch.ones_like(c, dtype=torch.bool), None, 0, None).sum() == 3


@pytest.mark.parametrize("gamma", [0.0, 0.05, 0.1, 0.5])
@pytest.mark.parametrize("seed", range(15))
def test_entropy_bound_is_largest_valid_prefix(gamma, seed):
    _, cand, entropy, _ = _batch(seed)
    commit = EntropyBoundPolicy(gamma).select(None, entropy, cand, None, 0, None)
    for b in range(cand.shape[0]):
        h = sorted(entropy[b][cand[b]].tolist())
        k = max((k for k in range(1, len(h) + 1) if sum(h[:k]) - max(h[:k]) <= gamma), default=0)
        assert int(commit[b].sum()) == k
        if k:  # the committed ones are the least uncertain
            rest = entropy[b][cand[b] & ~commit[b]]
            assert rest.numel() == 0 or entropy[b][commit[b]].max() <= rest.min()


@pytest.mark.parametrize("f", [0.5, 1.0, 2.0])
@pytest.mark.parametrize("seed", range(15))
def test_budget_is_largest_prefix_within_budget(f, seed):
    score, cand, _, _ = _batch(seed)
    score = score ** 0.1
    commit = BudgetPolicy(f).select(score, None, cand, None, 0, None)
    for b in range(cand.shape[0]):
        u = sorted((1 - c for c in score[b][cand[b]].tolist()))
        k = max((k for k in range(1, len(u) + 1) if sum(u[:k]) + max(u[:k]) < f), default=0)
        if u:
            k = max(k, 1)
        assert int(commit[b].sum()) == k


def test_even_schedule_splits_remainder_first():
    s = EvenSchedule(4)
    s.start_block(torch.tensor([10, 3, 8]))
    table = torch.stack([s.quota(i, torch.zeros(3, dtype=torch.long)) for i in range(4)], 1)
    assert table.tolist() == [[3, 3, 2, 2], [1, 1, 1, 0], [2, 2, 2, 2]]


def test_dream_schedule_last_step_takes_all():
    s = DreamSchedule(4)
    rem = torch.tensor([16])
    q0 = s.quota(0, rem)
    assert q0.item() == int(16 * (1 - s.timesteps[1] / s.timesteps[0]))
    assert s.quota(3, torch.tensor([5])).item() == 5


# --- Dream's compat parts: properties over random settings (hypothesis) ---------------------------

from hypothesis import given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from unmask.compat import OriginPolicy  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(steps=st.integers(1, 40), eps=st.floats(1e-4, 0.5), masks=st.lists(st.integers(0, 64), min_size=1, max_size=4))
def test_dream_schedule_drains_every_row_in_exactly_steps(steps, eps, masks):
    """Each quota is within [0, remaining], follows upstream's float32 int(r * (1 - s/t)), and the
    last step takes what is left, so every row is done after `steps` steps."""
    s = DreamSchedule(steps, eps)
    rem = torch.tensor(masks)
    for i in range(steps):
        q = s.quota(i, rem)
        assert ((q >= 0) & (q <= rem)).all()
        if i < steps - 1:
            t, u = s.timesteps[i], s.timesteps[i + 1]
            assert q.tolist() == [int(r * (1 - u / t)) for r in rem.float()]
        rem = rem - q
    assert (rem == 0).all()


@settings(max_examples=60, deadline=None)
@given(steps=st.integers(2, 20), step=st.integers(0, 19), seed=st.integers(0, 2**31 - 1),
       rows=st.integers(1, 3), width=st.integers(1, 12), density=st.floats(0, 1))
def test_origin_policy_draws_row_major_and_finishes_on_the_last_step(steps, step, seed, rows, width, density):
    step = step % steps
    g = torch.Generator().manual_seed(seed)
    cand = torch.rand(rows, width, generator=g) < density
    policy = OriginPolicy(DreamSchedule(steps))
    commit = policy.select(None, None, cand, None, step, torch.Generator().manual_seed(seed))
    assert commit.dtype == torch.bool and not (commit & ~cand).any()
    if step == steps - 1:
        assert commit.equal(cand)
        return
    # the same uniforms, drawn over the flattened candidates in row-major order, decide
    u = torch.rand(int(cand.sum()), generator=torch.Generator().manual_seed(seed))
    frac = float(policy.schedule.transfer_fraction(step))
    expected = torch.zeros_like(cand)
    expected[cand] = u < frac
    assert commit.equal(expected)
