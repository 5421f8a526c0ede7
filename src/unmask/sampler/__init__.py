"""Pure, batched decoding parts: proposal (logits -> token + confidence), commit policy (which
masked positions get their final token this step) and schedule (how many per step)."""

from unmask.sampler.policy import POLICIES, CommitPolicy, make_policy
from unmask.sampler.proposal import Proposal, ProposalConfig, propose
from unmask.sampler.schedule import DreamSchedule, EvenSchedule, Schedule

__all__ = [
    "POLICIES",
    "CommitPolicy",
    "make_policy",
    "Proposal",
    "ProposalConfig",
    "propose",
    "DreamSchedule",
    "EvenSchedule",
    "Schedule",
]
