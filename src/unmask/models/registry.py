"""Model families by config.json `model_type` / `architectures`. Remote code is never executed:
`auto_map` entries are ignored."""

from dataclasses import dataclass
from pathlib import Path
from typing import Callable

from unmask.errors import CheckpointError
from unmask.models.a2d import ARCHITECTURES as A2D_ARCHITECTURES, BASES as A2D_TYPES, a2d_arch, released as a2d_released
from unmask.models.base import ArchConfig, DiffusionLM
from unmask.models.blockdiff import fast_dllm_v2_arch, qwen2_arch, qwen2_released, qwen3_arch, sdar_arch
from unmask.models.diffusion_gemma import DiffusionGemmaModel, skipped_key
from unmask.models.diffusion_gemma_config import diffusion_gemma_arch
from unmask.models.dit import TOKENIZER_FROM as DIT_TOKENIZER, DiTModel, dit_arch, skipped_key as dit_skipped, \
    token_defaults as dit_token_defaults
from unmask.models.dream import dream_arch
from unmask.models.llada import LLaDAModel, llada_arch
from unmask.models.llada2 import LLaDA2Model, llada2_arch
from unmask.models.llada_moe import LLaDAMoEModel, llada_moe_arch
from unmask.models.qwen import QwenModel


@dataclass(frozen=True)
class Family:
    name: str
    model_types: tuple[str, ...]
    architectures: tuple[str, ...]
    arch: Callable[[dict], ArchConfig]
    cls: type[DiffusionLM]
    layout: str  # the release whose folder layout it reads (`unmask models`, --model's help)
    # checkpoint tensors the family does not load: key -> why ("vision": a vision tower, skipped
    # with one notice; "tied": a tied duplicate of a loaded weight), or None to load it
    skipped: Callable[[str], str | None] | None = None
    # config.json fields a known release implies without writing them, from its folder (A2D's BD3LM block)
    released: Callable[[Path], dict] | None = None
    # a release that ships no tokenizer: the Hub repository of the one it was trained with
    tokenizer_from: str | None = None
    # config.json token fields a release implies without writing them (MDLM / BD3-LM: the mask is the last id)
    token_defaults: Callable[[dict], dict] | None = None

    def arch_of(self, cfg: dict, folder: Path | None = None) -> ArchConfig:
        """The ArchConfig of a checkpoint's config.json (and, for a release that leaves a field
        out, what its folder says)."""
        implied = self.released(folder) if self.released is not None and folder is not None else {}
        return self.arch({**implied, **cfg})


FAMILIES = (
    # before LLaDA: LLaDA-MoE releases may say model_type "llada"; their architecture decides
    Family("llada_moe", ("lladamoe",), ("LLaDAMoEModelLM", "LLaDAMoEModel"), llada_moe_arch, LLaDAMoEModel,
           "LLaDA-MoE (inclusionAI/LLaDA-MoE-7B-A1B): masked diffusion, mixture of experts"),
    Family("llada", ("llada",), ("LLaDAModelLM",), llada_arch, LLaDAModel,
           "LLaDA (GSAI-ML/LLaDA-8B-Instruct / -Base): masked diffusion, full attention"),
    # LLaDA2.0 / 2.1: block-diffusion mixture of experts
    Family("llada2", ("llada2_moe",), ("LLaDA2MoeModelLM",), llada2_arch, LLaDA2Model,
           "LLaDA2.0 / 2.1 (inclusionAI/LLaDA2.x-mini / -flash): block diffusion, mixture of experts, editing"),
    Family("dream", ("dream",), ("DreamModel",), dream_arch, QwenModel,
           "Dream (Dream-org/Dream-v0-Instruct-7B): masked diffusion from Qwen2.5"),
    # block diffusion in the Qwen layouts: the Qwen decoder with block-causal attention
    Family("fast_dllm_v2", ("fast_dllm_qwen",), ("Fast_dLLM_QwenForCausalLM",), fast_dllm_v2_arch, QwenModel,
           "Fast-dLLM v2 (Efficient-Large-Model/Fast_dLLM_v2_7B): block diffusion from Qwen2.5"),
    Family("sdar", ("sdar",), ("SDARForCausalLM",), sdar_arch, QwenModel,
           "SDAR (JetLM/SDAR-*-Chat): block diffusion from Qwen3"),
    # dllm's A2D: autoregressive Qwen2 / Qwen3 / Llama made bidirectional, trained as MDLM or BD3LM
    Family("a2d", tuple(A2D_TYPES), A2D_ARCHITECTURES, a2d_arch, QwenModel,
           "dllm A2D (dllm-hub/Qwen3-0.6B-diffusion-mdlm-v0.1, -bd3lm-v0.1, "
           "dllm-hub/Qwen2.5-Coder-0.5B-Instruct-diffusion-{mdlm,bd3lm}-v0.1): masked or block diffusion "
           "from Qwen2, Qwen3 or Llama", released=a2d_released),
    # kuleshov-group's DiT: MDLM (full attention) and BD3-LM (blocks), GPT-2's tokenizer plus a mask
    Family("dit", ("bd3lm", "mdlm"), ("BD3LM", "MDLM"), dit_arch, DiTModel,
           "MDLM / BD3-LM (kuleshov-group/mdlm-owt, kuleshov-group/bd3lm-owt-block_size{4,8,16}): masked or block "
           "diffusion DiT, unconditional, GPT-2's tokenizer (openai-community/gpt2) plus a mask", dit_skipped,
           tokenizer_from=DIT_TOKENIZER, token_defaults=dit_token_defaults),
    # an autoregressive Qwen3 target (for speculative decoding), by architecture only: DFlash
    # drafters' configs also say model_type "qwen3"
    Family("qwen3", (), ("Qwen3ForCausalLM",), qwen3_arch, QwenModel,
           "Qwen3 (Qwen/Qwen3-*): autoregressive, the target of a DFlash drafter and the parent of A2D-Qwen3"),
    Family("qwen2", (), ("Qwen2ForCausalLM",), qwen2_arch, QwenModel,
           "Qwen2 / Qwen2.5 (Qwen/Qwen2.5-Coder-0.5B-Instruct): autoregressive, the parent of A2D-Qwen2; a folder "
           "named open-dcoder* (fredzzp/open-dcoder-0.5B) is Open-dCoder: masked diffusion from Qwen2.5-Coder",
           released=qwen2_released),
    # renoising block diffusion on the Gemma 4 stack (text only)
    Family("diffusion_gemma", ("diffusion_gemma",), ("DiffusionGemmaForBlockDiffusion",), diffusion_gemma_arch,
           DiffusionGemmaModel,
           "DiffusionGemma (transformers' diffusion_gemma, text only): renoising block diffusion", skipped_key),
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


def layouts() -> list[tuple[str, str]]:
    """(what config.json must say, the release it reads) for every family: `unmask models`."""
    out = []
    for fam in FAMILIES:
        says = [f"model_type {t!r}" for t in fam.model_types] + [f"architectures {a!r}" for a in fam.architectures[:1]]
        out.append((" or ".join(says), fam.layout))
    return out
