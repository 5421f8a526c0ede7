"""Batched decoding parts: proposal (logits -> token + confidence), commit policy (which masked
positions get their final token this step) and schedule (how many per step). Policies are
stateless; a schedule holds its per-row quota table for the current block. Nothing here imports
models, caches or the engine."""

from unmask.sampler.policy import POLICIES, CommitPolicy, make_policy
from unmask.sampler.proposal import Proposal, ProposalConfig, propose
from unmask.sampler.schedule import EvenSchedule, Schedule

__all__ = ["POLICIES", "CommitPolicy", "make_policy", "Proposal", "ProposalConfig", "propose", "EvenSchedule",
           "Schedule"]
