"""Model families by config.json `model_type` / `architectures`. Remote code is never executed:
`auto_map` entries are ignored."""

from dataclasses import dataclass
from typing import Callable

from unmask.errors import CheckpointError
from unmask.models.base import ArchConfig, DiffusionLM
from unmask.models.blockdiff import fast_dllm_v2_arch, qwen3_arch, sdar_arch
from unmask.models.diffusion_gemma import DiffusionGemmaModel, diffusion_gemma_arch, skipped_key
from unmask.models.dream import DreamModel, dream_arch
from unmask.models.llada import LLaDAModel, llada_arch
from unmask.models.llada2 import LLaDA2Model, llada2_arch
from unmask.models.llada_moe import LLaDAMoEModel, llada_moe_arch


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    arch: Callable[[dict], ArchConfig]
    cls: type[DiffusionLM]
    # checkpoint tensors the family does not load: key -> why ("vision": a vision tower, skipped
    # with one notice; "tied": a tied duplicate of a loaded weight), or None to load it
    skipped: Callable[[str], str | None] | None = None


FAMILIES = (
    # before LLaDA: LLaDA-MoE releases may say model_type "llada"; their architecture decides
    Family("llada_moe", ("lladamoe",), ("LLaDAMoEModelLM", "LLaDAMoEModel"), llada_moe_arch, LLaDAMoEModel),
    Family("llada", ("llada",), ("LLaDAModelLM",), llada_arch, LLaDAModel),
    # LLaDA2.0 / 2.1: block-diffusion mixture of experts
    Family("llada2", ("llada2_moe",), ("LLaDA2MoeModelLM",), llada2_arch, LLaDA2Model),
    Family("dream", ("dream",), ("DreamModel",), dream_arch, DreamModel),
    # block diffusion in the Qwen layouts: the Qwen decoder with block-causal attention
    Family("fast_dllm_v2", ("fast_dllm_qwen",), ("Fast_dLLM_QwenForCausalLM",), fast_dllm_v2_arch, DreamModel),
    Family("sdar", ("sdar",), ("SDARForCausalLM",), sdar_arch, DreamModel),
    # an autoregressive Qwen3 target (for speculative decoding), by architecture only: DFlash
    # drafters' configs also say model_type "qwen3"
    Family("qwen3", (), ("Qwen3ForCausalLM",), qwen3_arch, DreamModel),
    # renoising block diffusion on the Gemma 4 stack (text only)
    Family("diffusion_gemma", ("diffusion_gemma",), ("DiffusionGemmaForBlockDiffusion",), diffusion_gemma_arch,
           DiffusionGemmaModel, skipped_key),
)


def resolve_family(cfg: dict) -> Family:
    model_type = str(cfg.get("model_type", "")).lower()
    archs = cfg.get("architectures") or []
    if not isinstance(archs, list) or not all(isinstance(a, str) for a in archs):
        raise CheckpointError(f"config.json: architectures {archs!r} must be a list of class names")
    for fam in FAMILIES:
        if model_type in fam.model_types or any(a in fam.architectures for a in archs):
            return fam
    known = ", ".join(t for f in FAMILIES for t in f.model_types)
    raise CheckpointError(
        f"config.json: unknown model_type {cfg.get('model_type')!r} (architectures {archs!r}); supported: {known}"
    )
