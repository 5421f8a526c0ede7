"""The renoising sampler's pure parts (DiffusionGemma's EntropyBoundSampler and its stopping
test), shared by the reference loop (unmask.reference.diffusion_gemma) and the engine
(unmask.engine.renoise)."""

import torch


def categorical_entropy(logits: torch.Tensor) -> torch.Tensor:
    """torch.distributions.Categorical(logits=...).entropy(), the same operations."""
    lg = logits - logits.logsumexp(dim=-1, keepdim=True)
    p = torch.softmax(lg, dim=-1)
    return -(torch.clamp(lg, min=torch.finfo(lg.dtype).min) * p).sum(-1)


def accept_mask(entropy: torch.Tensor, bound) -> torch.Tensor:
    """Entropy-bound acceptance: (B, L) entropies -> (B, L) accepted positions, the lowest
    entropies first while cumsum(sorted H) - H <= bound (at least the lowest one); `bound` a
    number or (B, 1) per row."""
    sorted_h, order = torch.sort(entropy, dim=-1, descending=False)
    keep = torch.cumsum(sorted_h, dim=-1) - sorted_h <= bound
    return torch.scatter(torch.zeros_like(keep), -1, order, keep)
