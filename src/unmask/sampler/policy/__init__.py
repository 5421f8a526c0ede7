"""Commit policies: which masked candidates receive their final token this step.

All policies are batched over rows: inputs are (B, W) tensors whose non-candidate entries are
ignored; output is a (B, W) bool tensor that is a subset of the candidates. Every policy commits
at least one token in a row that has a candidate and a positive quota.

A policy is one class in one file here, registered with `@register` (base.py): it declares its
name, the generation parameters it reads (`fields`, as unmask.knobs.Knob: default, type, help,
range), the one that tunes it (its knob) and how it is built from the parameters. The CLI flags,
the bench grid and the lm-eval arguments are derived from that. The files register in the order
below (the order of every listing): fixed (LLaDA), threshold (Fast-dLLM), edit (LLaDA2.1), remdm
(ReMDM), factor (Fast-dLLM), entropy (EB-sampler), budget (seed 004).
"""

# isort: skip_file  (the files register in this order)
from unmask.sampler.policy.base import (POLICIES, CommitPolicy, Registered, Revision, make_policy, register,
                                        sorted_candidates, take_top)
from unmask.sampler.policy.fixed import FixedPolicy
from unmask.sampler.policy.threshold import ThresholdPolicy
from unmask.sampler.policy.edit import DEFAULT_EDIT_THRESHOLD, EditPolicy
from unmask.sampler.policy.remdm import REMDM_STRATEGIES, ReMDMPolicy
from unmask.sampler.policy.factor import FactorPolicy
from unmask.sampler.policy.entropy import EntropyBoundPolicy
from unmask.sampler.policy.budget import BudgetPolicy

__all__ = ["DEFAULT_EDIT_THRESHOLD", "POLICIES", "REMDM_STRATEGIES", "BudgetPolicy", "CommitPolicy",
           "EditPolicy", "EntropyBoundPolicy", "FactorPolicy", "FixedPolicy", "ReMDMPolicy", "Registered",
           "Revision", "ThresholdPolicy", "make_policy", "register", "sorted_candidates", "take_top"]
