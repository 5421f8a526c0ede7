"""Per-token log-probabilities (the logprobs a server returns): the chosen token's and the most
likely tokens', from the logits the token was chosen from, without a (B, W, V) probability tensor.

A masked or block row's token is scored at the forward that committed it (the model's
distribution at temperature 1 there, after structured output's mask where one applied), a
speculative row's under the target's verifying forward, a renoising row's under the sampler's
distribution at the step its canvas stopped. -inf (a token a grammar's mask excluded) is reported
as FLOOR, a finite number JSON can carry."""

import torch

from unmask.errors import UnmaskError

TOP_LOGPROBS = 20  # the most top_logprobs a request may ask for (OpenAI's bound for chat)
FLOOR = -9999.0


def check_logprobs(value) -> int | None:
    """None (no logprobs) or the number of most likely tokens to report beside each chosen one."""
    if value is None:
        return None
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= TOP_LOGPROBS:
        raise UnmaskError(f"logprobs {value!r} must be None or an integer in [0, {TOP_LOGPROBS}] "
                          "(the most likely tokens reported beside each chosen one)", param="logprobs")
    return value


def token_logprobs(logits: torch.Tensor, tokens: torch.Tensor, top: int = 0):
    """logits (..., V), tokens (...) -> (logprob of each token (...), and with `top` > 0 the `top`
    most likely ids (..., top) and their logprobs, else None, None), in float32, floored at FLOOR."""
    lg = logits.float()
    lse = lg.logsumexp(-1)
    lp = (lg.gather(-1, tokens[..., None]).squeeze(-1) - lse).clamp(min=FLOOR)
    if not top:
        return lp, None, None
    val, ids = lg.topk(min(top, lg.shape[-1]), -1)
    return lp, ids, (val - lse[..., None]).clamp(min=FLOOR)
