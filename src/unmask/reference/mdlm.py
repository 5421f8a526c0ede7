"""The MDLM repository's sampler (kuleshov-group/mdlm `diffusion.py`: `Diffusion._sample` with
`_ddpm_caching_update` or `_ddpm_update`, `_sample_categorical`, and its final noise removal),
reproduced token for token and forward for forward (`compat mdlm`), on MDLM models
(unmask.models.dit, full attention). Checked against what that code returned
(tests/test_bd3lms_upstream.py, tests/data/mdlm-upstream).

The reference samples unconditionally: the whole sequence starts as masks. Here a prompt (possibly
empty: the reference exactly) is committed before sampling, and gen_length masks follow it. Steps
run at t = linspace(1, 1e-5, steps + 1)[i], dt = (1 - 1e-5) / steps, all in float32:
- `ddpm_cache` (its default): q = p * (t - s) with the mask's column set to s = t - dt; a token
  is drawn per position (Gumbel over the float32 q: u uniform over the whole (B, L, V) tensor,
  argmax of q / (1e-10 - log(u + 1e-10))); committed positions keep theirs; a step that changes
  nothing keeps its probabilities and the next runs no forward;
- `ddpm`: the same draw with move chances 1 - exp(-sigma), sigma = -log1p(-(1 - 1e-3) t) (its
  log-linear noise), a forward every step.
With `noise_removal` (its default) one last forward commits the argmax at every mask still left.
"""

import torch

from unmask.errors import UnmaskError
from unmask.models.base import DiffusionLM, TokenIds
from unmask.params import GenerationParams
from unmask.reference.bd3lms import _log_probs, _sample_categorical
from unmask.trace import Decoded, ForwardRecord

EPS = 1e-5  # _sample's eps: the last timestep
NOISE_EPS = 1e-3  # LogLinearNoise's eps
DEFAULT_STEPS = 128  # its configs/config.yaml sampling.steps


def _move_chance(t: torch.Tensor) -> torch.Tensor:
    return 1 - torch.exp(-(-torch.log1p(-(1 - NOISE_EPS) * t)))


@torch.inference_mode()
def decode_mdlm_repo(model: DiffusionLM, tokens: TokenIds, prompts: list[list[int]],
                     params: GenerationParams) -> Decoded:
    c = model.config
    if c.family != "mdlm" or c.causal:
        raise UnmaskError(f"compat 'mdlm' runs MDLM models (full attention); this is a {c.family} model",
                          param="compat")
    device = next(model.parameters()).device
    mask, B, P = tokens.mask, len(prompts), len(prompts[0])
    L = P + params.gen_length
    x = torch.full((B, L), mask, dtype=torch.long, device=device)
    if P:
        x[:, :P] = torch.tensor(prompts, dtype=torch.long, device=device)
    gen = torch.Generator(device).manual_seed(params.seed) if params.seed is not None else None
    steps = params.steps if params.steps is not None else DEFAULT_STEPS
    timesteps = torch.linspace(1, EPS, steps + 1, device=device)
    dt = (1 - EPS) / steps
    ones = torch.ones(B, 1, device=device)
    trace: list[ForwardRecord] = []
    commits: list[torch.Tensor] = []

    def forward():
        trace.append(ForwardRecord("full", B, L, 0, block=0))
        commits.append(torch.zeros(B, dtype=torch.long, device=device))
        return _log_probs(model, x)

    p_x0 = None
    for i in range(steps):
        t = (timesteps[i] * ones).squeeze(-1)
        if params.predictor == "ddpm":
            move_t, move_s = _move_chance(t)[:, None, None], _move_chance(t - dt)[:, None, None]
            q = forward().exp() * (move_t - move_s)
        else:
            move_t, move_s = t[:, None, None], (t - dt)[:, None, None]
            if p_x0 is None:
                p_x0 = forward().exp()
            q = p_x0 * (move_t - move_s)
        q[:, :, mask] = move_s[:, :, 0]
        proposal = _sample_categorical(q, gen)
        keep = (x != mask).to(x.dtype)
        new = keep * x + (1 - keep) * proposal
        commits[-1] = commits[-1] + ((x == mask) & (new != mask)).sum(-1)
        if not torch.equal(new, x):
            p_x0 = None
        x = new
    if params.noise_removal:
        open_ = x == mask
        best = forward().argmax(dim=-1)
        commits[-1] = open_.sum(-1)
        x = torch.where(open_, best, x)
    per_row = torch.stack(commits, 1).tolist()
    for rec, n in zip(trace, torch.stack(commits).sum(-1).tolist()):
        rec.committed = n
    return Decoded([row[P:] for row in x.tolist()], [len(trace)] * B, per_row, trace, "none", P)
