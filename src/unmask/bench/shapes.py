"""The released models' shapes the roofline model prices without their weights (`unmask roofline
--model NAME`): their published config.json as an ArchConfig."""


def shape(name: str):
    """The ArchConfig of a shape named in SHAPES, or None for any other name."""
    for names, build in ((DENSE_SHAPES, dense_shape), (MOE_SHAPES, moe_shape), (RENOISE_SHAPES, renoise_shape)):
        if name in names:
            return build(name)
    return None


def moe_shape(name: str):
    """The published LLaDA2.0 shapes (inclusionAI config.json): mini 16B (1.4B active), flash 100B."""
    from unmask.layers.moe import MoEConfig
    from unmask.models.base import ArchConfig

    d, layers, heads, dense, expert = {"llada2-mini": (2048, 20, 16, 5120, 512),
                                       "llada2-flash": (4096, 32, 32, 9216, 1024)}[name]
    moe = MoEConfig(num_experts=256, top_k=8, expert_size=expert, shared_size=expert, first_dense=1, n_group=8,
                    topk_group=4, routed_scale=2.5, expert_bias=True)
    return ArchConfig("llada2", 157184, d, layers, heads, 4, dense, 600000.0, 1e-6, 32768, qk_norm=True,
                      rotary_dim=64, block_size=32, moe=moe)


def renoise_shape(name: str):
    """DiffusionGemma 26B-A4B: the Gemma 4 26B-A4B text stack (its published config: 30 layers of
    hidden 2816, 16 heads, 8 key/value heads of 256 on sliding layers and 2 of 512 on every sixth
    (full) layer, window 1024, dense MLP 2112 beside 128 experts of 704, top 8, vocabulary 262144)."""
    from unmask.models.diffusion_gemma_config import diffusion_gemma_arch

    assert name == "diffusiongemma-26b-a4b"
    return diffusion_gemma_arch({"canvas_length": 256, "text_config": {
        "vocab_size": 262144, "hidden_size": 2816, "intermediate_size": 2112, "num_hidden_layers": 30,
        "num_attention_heads": 16, "num_key_value_heads": 8, "head_dim": 256, "global_head_dim": 512,
        "num_global_key_value_heads": 2, "num_experts": 128, "top_k_experts": 8, "moe_intermediate_size": 704,
        "sliding_window": 1024, "max_position_embeddings": 262144}})


def dense_shape(name: str):
    """LLaDA-8B (GSAI-ML/LLaDA-8B-Instruct config.json): 32 layers of 4096, 32 heads (no GQA), MLP
    12288, vocabulary 126464, untied head. Qwen3-8B (Qwen/Qwen3-8B config.json, the target of
    z-lab's Qwen3-8B-DFlash-b16): causal, 36 layers of 4096, 32 heads, 8 key/value heads of 128,
    MLP 12288, vocabulary 151936, untied head."""
    from unmask.models.base import ArchConfig

    if name == "qwen3-8b":
        return ArchConfig("qwen3", 151936, 4096, 36, 32, 8, 12288, 1000000.0, 1e-6, 40960, causal=True,
                          head_size=128, qk_norm=True)
    assert name == "llada-8b"
    return ArchConfig("llada", 126464, 4096, 32, 32, 32, 12288, 500000.0, 1e-5, 4096)


DENSE_SHAPES = ("llada-8b", "qwen3-8b")


MOE_SHAPES = ("llada2-mini", "llada2-flash")


RENOISE_SHAPES = ("diffusiongemma-26b-a4b",)


SHAPES = DENSE_SHAPES + MOE_SHAPES + RENOISE_SHAPES
