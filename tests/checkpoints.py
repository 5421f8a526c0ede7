"""Tiny random checkpoints written in the released LLaDA and Dream folder layouts.

Key names and shapes are spelled out here from the released checkpoints (ecosystem.md), not taken
from unmask's own modules, so the loader is tested against the layout and not against itself.
"""

import json
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, models, pre_tokenizers

LLADA_SPECIALS = ["<|startoftext|>", "<|endoftext|>", "<|mdm_mask|>", "<|eot_id|>", "<|start_header_id|>", "<|end_header_id|>"]
DREAM_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|mask|>"]
WORDS = [str(d) for d in range(10)] + [f"w{i}" for i in range(40)] + ["user", "assistant", "+", "=", "?"]

LLADA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
    "{{ m['content'] }}<|eot_id|>{% endfor %}"
    "{% if add_generation_prompt %}<|start_header_id|>assistant<|end_header_id|>\n\n{% endif %}"
)


# what the byte-level BPE below is trained on: JSON, numbers, words and code-like text
BPE_CORPUS = [
    '{"name": "ann", "age": 42, "tags": ["a", "b"], "ok": true, "x": null}',
    '[1, 2.5, -3e4, {"k": "v"}] the quick brown fox jumps over the lazy dog 0123456789',
    'def f(x):\n    return x + 1  # user assistant email@example.com 2026-12-03 http://a.b/c',
] * 20


def _write_bpe_tokenizer(folder: Path, specials: list[str], size: int = 400) -> dict[str, int]:
    """A byte-level BPE tokenizer (every real checkpoint's kind): the 256 bytes, merges trained on
    BPE_CORPUS, then the specials."""
    from tokenizers import decoders, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=size, initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
                                  show_progress=False)
    tok.train_from_iterator(BPE_CORPUS, trainer)
    tok.add_special_tokens(specials)
    tok.save(str(folder / "tokenizer.json"))
    return tok.get_vocab(with_added_tokens=True)


def _write_tokenizer(folder: Path, specials: list[str], bpe: bool = False) -> dict[str, int]:
    if bpe:
        return _write_bpe_tokenizer(folder, specials)
    vocab = {t: i for i, t in enumerate(WORDS)}
    for s in specials:
        vocab[s] = len(vocab)
    tok = Tokenizer(models.WordLevel(vocab, unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(specials)
    tok.save(str(folder / "tokenizer.json"))
    return vocab


def _save_sharded(folder: Path, tensors: dict[str, torch.Tensor], shards: int) -> None:
    keys = list(tensors)
    per = -(-len(keys) // shards)
    weight_map = {}
    for i in range(shards):
        name = f"model-{i + 1:05d}-of-{shards:05d}.safetensors"
        part = {k: tensors[k].contiguous() for k in keys[i * per : (i + 1) * per]}
        save_file(part, str(folder / name), metadata={"format": "pt"})
        weight_map.update({k: name for k in part})
    index = {"metadata": {"total_size": sum(t.numel() * 4 for t in tensors.values())}, "weight_map": weight_map}
    (folder / "model.safetensors.index.json").write_text(json.dumps(index, indent=2))


def llada_tensors(vocab: int, d: int, layers: int, heads: int, kv_heads: int, ff: int, gen: torch.Generator, scale=0.3):
    hd = d // heads
    r = lambda *s: torch.randn(*s, generator=gen) * scale  # noqa: E731
    t = {"model.transformer.wte.weight": r(vocab, d) * 3}
    for i in range(layers):
        p = f"model.transformer.blocks.{i}."
        t[p + "attn_norm.weight"] = 1 + 0.1 * torch.randn(d, generator=gen)
        t[p + "ff_norm.weight"] = 1 + 0.1 * torch.randn(d, generator=gen)
        t[p + "q_proj.weight"] = r(heads * hd, d)
        t[p + "k_proj.weight"] = r(kv_heads * hd, d)
        t[p + "v_proj.weight"] = r(kv_heads * hd, d)
        t[p + "attn_out.weight"] = r(d, heads * hd)
        t[p + "ff_proj.weight"] = r(ff, d)
        t[p + "up_proj.weight"] = r(ff, d)
        t[p + "ff_out.weight"] = r(d, ff)
    t["model.transformer.ln_f.weight"] = torch.ones(d)
    t["model.transformer.ff_out.weight"] = r(vocab, d) * 3
    return t


def write_llada(folder, d=32, layers=2, heads=4, kv_heads=2, ff=64, seed=0, shards=2, max_len=512,
                bpe: bool = False) -> Path:
    """`bpe`: a byte-level BPE tokenizer (as LLaDA's) instead of the tiny word-level one."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = _write_tokenizer(folder, LLADA_SPECIALS, bpe)
    V = max(vocab.values()) + 4  # embedding_size may exceed the tokenizer's vocabulary, as in LLaDA-8B
    cfg = {
        "architectures": ["LLaDAModelLM"],
        "model_type": "llada",
        "auto_map": {"AutoConfig": "configuration_llada.LLaDAConfig", "AutoModel": "modeling_llada.LLaDAModelLM"},
        "d_model": d, "n_layers": layers, "n_heads": heads, "n_kv_heads": kv_heads,
        "mlp_hidden_size": ff, "mlp_ratio": 4, "vocab_size": V, "embedding_size": V,
        "max_sequence_length": max_len, "rope": True, "rope_theta": 10000.0, "rope_full_precision": True,
        "rms_norm_eps": 1e-5, "layer_norm_type": "rms", "block_type": "llama", "activation_type": "silu",
        "include_bias": False, "include_qkv_bias": False, "weight_tying": False, "alibi": False,
        "scale_logits": False, "block_group_size": 1,
        "mask_token_id": vocab["<|mdm_mask|>"], "eos_token_id": vocab["<|endoftext|>"],
        "pad_token_id": vocab["<|endoftext|>"], "use_cache": False, "precision": "amp_bf16",
    }
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": vocab["<|endoftext|>"]}))
    tok_cfg = {
        "bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
        "chat_template": LLADA_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast",
    }
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    (folder / "special_tokens_map.json").write_text(json.dumps({"eos_token": "<|endoftext|>"}))
    g = torch.Generator().manual_seed(seed)
    t = llada_tensors(V, d, layers, heads, kv_heads, ff, g)
    # the references can propose MASK and then never finish (reference-semantics gotcha 13):
    # give MASK a zero output row so no model here ever prefers it
    t["model.transformer.ff_out.weight"][cfg["mask_token_id"]] = 0
    _save_sharded(folder, t, shards)
    return folder


def dream_tensors(vocab: int, d: int, layers: int, heads: int, kv_heads: int, ff: int, gen: torch.Generator, scale=0.3):
    hd = d // heads
    r = lambda *s: torch.randn(*s, generator=gen) * scale  # noqa: E731
    t = {"model.embed_tokens.weight": r(vocab, d) * 3}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(d, generator=gen)
        t[p + "post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(d, generator=gen)
        for n, rows in (("q", heads * hd), ("k", kv_heads * hd), ("v", kv_heads * hd)):
            t[p + f"self_attn.{n}_proj.weight"] = r(rows, d)
            t[p + f"self_attn.{n}_proj.bias"] = r(rows)
        t[p + "self_attn.o_proj.weight"] = r(d, heads * hd)
        t[p + "mlp.gate_proj.weight"] = r(ff, d)
        t[p + "mlp.up_proj.weight"] = r(ff, d)
        t[p + "mlp.down_proj.weight"] = r(d, ff)
    t["model.norm.weight"] = torch.ones(d)
    t["lm_head.weight"] = r(vocab, d) * 3
    return t


def write_dream(folder, d=32, layers=2, heads=4, kv_heads=2, ff=64, seed=0, shards=2, bpe: bool = False) -> Path:
    """`bpe`: a byte-level BPE tokenizer (as Dream's) instead of the tiny word-level one."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = _write_tokenizer(folder, DREAM_SPECIALS, bpe)
    V = max(vocab.values()) + 1
    cfg = {
        "architectures": ["DreamModel"], "model_type": "Dream",
        "auto_map": {"AutoConfig": "configuration_dream.DreamConfig", "AutoModel": "modeling_dream.DreamModel"},
        "hidden_size": d, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": kv_heads, "intermediate_size": ff, "vocab_size": V, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "max_position_embeddings": 512, "tie_word_embeddings": False,
        "mask_token_id": vocab["<|mask|>"], "pad_token_id": vocab["<|endoftext|>"],
        "eos_token_id": vocab["<|endoftext|>"], "bos_token_id": vocab["<|endoftext|>"],
    }
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": vocab["<|endoftext|>"]}))
    tok_cfg = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "tokenizer_class": "DreamTokenizer"}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    g = torch.Generator().manual_seed(seed)
    t = dream_tensors(V, d, layers, heads, kv_heads, ff, g)
    t["lm_head.weight"][cfg["mask_token_id"]] = 0
    _save_sharded(folder, t, shards)
    return folder


QWEN_BLOCK_SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
QWEN_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }}\n{{ m['content'] }}<|im_end|>\n{% endfor %}"
    "{% if add_generation_prompt %}<|im_start|>assistant\n{% endif %}"
)


def _write_qwen_block(folder: Path, cfg: dict, mask: str, tensors_fn, seed: int, shards: int,
                      config_pad: str = "<|endoftext|>") -> Path:
    folder.mkdir(parents=True, exist_ok=True)
    vocab = _write_tokenizer(folder, QWEN_BLOCK_SPECIALS + [mask])
    cfg = {**cfg, "vocab_size": len(vocab), "eos_token_id": vocab["<|im_end|>"], "bos_token_id": vocab["<|endoftext|>"],
           "pad_token_id": vocab[config_pad]}
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    gen = {"bos_token_id": vocab["<|endoftext|>"], "do_sample": False,
           "eos_token_id": [vocab["<|im_end|>"], vocab["<|endoftext|>"]], "pad_token_id": vocab["<|endoftext|>"]}
    (folder / "generation_config.json").write_text(json.dumps(gen))
    tok_cfg = {"eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": QWEN_TEMPLATE,
               "tokenizer_class": "Qwen2Tokenizer"}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    g = torch.Generator().manual_seed(seed)
    t = tensors_fn(len(vocab), g)
    t["lm_head.weight"][vocab[mask]] = 0
    _save_sharded(folder, t, shards)
    return folder


def write_fast_dllm_v2(folder, d=32, layers=2, heads=4, kv_heads=2, ff=64, bd_size=8, seed=0, shards=2) -> Path:
    """Fast-dLLM v2's layout (Efficient-Large-Model/Fast_dLLM_v2_7B) with the release's quirks: Qwen2.5
    keys with q/k/v biases, bd_size in config.json, the mask token `|<MASK>|` found in the tokenizer
    (no mask_token_id), config.json's pad_token_id equal to the stop token `<|im_end|>` while the
    tokenizer's pad is `<|endoftext|>`, the release's misspelt `conplemenrary_mask` and its
    `layer_types` / `max_window_layers` (tests/data/fast-dllm-v2-upstream/tiny has the same keys)."""
    cfg = {
        "architectures": ["Fast_dLLM_QwenForCausalLM"], "model_type": "Fast_dLLM_Qwen",
        "auto_map": {"AutoConfig": "configuration.Fast_dLLM_QwenConfig", "AutoModel": "modeling.Fast_dLLM_QwenModel",
                     "AutoModelForCausalLM": "modeling.Fast_dLLM_QwenForCausalLM"},
        "attention_dropout": 0.0, "bd_size": bd_size, "conplemenrary_mask": True, "hidden_size": d,
        "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "intermediate_size": ff, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0, "initializer_range": 0.02,
        "layer_types": ["full_attention"] * layers, "max_window_layers": layers,
        "max_position_embeddings": 32768, "tie_word_embeddings": False, "hidden_act": "silu", "use_cache": True,
        "use_sliding_window": False, "sliding_window": None, "rope_scaling": None, "torch_dtype": "bfloat16",
        "transformers_version": "4.53.1",
    }
    return _write_qwen_block(Path(folder), cfg, "|<MASK>|",
                             lambda V, g: dream_tensors(V, d, layers, heads, kv_heads, ff, g), seed, shards,
                             config_pad="<|im_end|>")


def sdar_tensors(vocab: int, d: int, layers: int, heads: int, kv_heads: int, hd: int, ff: int, gen, scale=0.3):
    r = lambda *s: torch.randn(*s, generator=gen) * scale  # noqa: E731
    t = {"model.embed_tokens.weight": r(vocab, d) * 3}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(d, generator=gen)
        t[p + "post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(d, generator=gen)
        for n, rows in (("q", heads * hd), ("k", kv_heads * hd), ("v", kv_heads * hd)):
            t[p + f"self_attn.{n}_proj.weight"] = r(rows, d)
        t[p + "self_attn.q_norm.weight"] = 1 + 0.1 * torch.randn(hd, generator=gen)
        t[p + "self_attn.k_norm.weight"] = 1 + 0.1 * torch.randn(hd, generator=gen)
        t[p + "self_attn.o_proj.weight"] = r(d, heads * hd)
        t[p + "mlp.gate_proj.weight"] = r(ff, d)
        t[p + "mlp.up_proj.weight"] = r(ff, d)
        t[p + "mlp.down_proj.weight"] = r(d, ff)
    t["model.norm.weight"] = torch.ones(d)
    t["lm_head.weight"] = r(vocab, d) * 3
    return t


def write_sdar(folder, d=32, layers=2, heads=4, kv_heads=2, head_dim=16, ff=64, seed=0, shards=2, **extra) -> Path:
    """SDAR's layout (JetLM/SDAR-*-Chat): Qwen3 keys, per-head q_norm/k_norm, head_dim that need not
    be hidden_size / heads (here 4 x 16 = 64 > 32), no q/k/v biases, mask token `<|MASK|>`."""
    cfg = {
        "architectures": ["SDARForCausalLM"], "model_type": "sdar",
        "auto_map": {"AutoConfig": "configuration_sdar.SDARConfig", "AutoModelForCausalLM": "modeling_sdar.SDARForCausalLM"},
        "hidden_size": d, "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv_heads,
        "head_dim": head_dim, "intermediate_size": ff, "rms_norm_eps": 1e-6, "rope_theta": 1000000.0,
        "max_position_embeddings": 32768, "tie_word_embeddings": False, "attention_bias": False,
        "hidden_act": "silu", "use_sliding_window": False, "rope_scaling": None, **extra,
    }
    return _write_qwen_block(Path(folder), cfg, "<|MASK|>",
                             lambda V, g: sdar_tensors(V, d, layers, heads, kv_heads, head_dim, ff, g), seed, shards)


def write_llada_block(folder, bd_size=4, **kw) -> Path:
    """unmask's own block-diffusion layout: a LLaDA folder with bd_size and logit_shift (default-block)."""
    folder = write_llada(folder, **kw)
    cfg = json.loads((folder / "config.json").read_text())
    cfg.update(bd_size=bd_size, logit_shift=1)
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    return folder


LLADA2_SPECIALS = ["<|endoftext|>", "<|mask|>", "<role>", "</role>", "<|role_end|>"]


def llada2_tensors(vocab: int, d: int, layers: int, heads: int, kv_heads: int, ff: int, experts: int, eff: int,
                   shared: int, dense_layers: int, gen, scale=0.3, out_bias: bool = False):
    """LLaDA2.x keys (inclusionAI/LLaDA2.0-mini's model.safetensors index): fused query_key_value,
    query/key layernorms, `dense`, dense `mlp` in the first layers, then `mlp.gate` (+ expert_bias),
    `mlp.experts.{e}` and `mlp.shared_experts`."""
    hd = d // heads
    r = lambda *s: torch.randn(*s, generator=gen) * scale  # noqa: E731
    t = {"model.word_embeddings.weight": r(vocab, d) * 3}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(d, generator=gen)
        t[p + "post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(d, generator=gen)
        t[p + "attention.query_key_value.weight"] = r((heads + 2 * kv_heads) * hd, d)
        t[p + "attention.query_layernorm.weight"] = 1 + 0.1 * torch.randn(hd, generator=gen)
        t[p + "attention.key_layernorm.weight"] = 1 + 0.1 * torch.randn(hd, generator=gen)
        t[p + "attention.dense.weight"] = r(d, heads * hd)
        if out_bias:
            t[p + "attention.dense.bias"] = r(d)
        if i < dense_layers:
            for n, shape in (("gate_proj", (ff, d)), ("up_proj", (ff, d)), ("down_proj", (d, ff))):
                t[p + f"mlp.{n}.weight"] = r(*shape)
            continue
        t[p + "mlp.gate.weight"] = r(experts, d) * 3
        t[p + "mlp.gate.expert_bias"] = 0.1 * torch.randn(experts, generator=gen)
        for e in range(experts):
            for n, shape in (("gate_proj", (eff, d)), ("up_proj", (eff, d)), ("down_proj", (d, eff))):
                t[p + f"mlp.experts.{e}.{n}.weight"] = r(*shape)
        if shared:
            for n, shape in (("gate_proj", (eff * shared, d)), ("up_proj", (eff * shared, d)),
                             ("down_proj", (d, eff * shared))):
                t[p + f"mlp.shared_experts.{n}.weight"] = r(*shape)
    t["model.norm.weight"] = torch.ones(d)
    t["lm_head.weight"] = r(vocab, d) * 3
    return t


def write_llada2(folder, d=32, layers=3, heads=4, kv_heads=2, ff=48, experts=8, top_k=2, eff=16, shared=1,
                 n_group=4, topk_group=2, dense_layers=1, seed=0, shards=2, out_bias=False, **extra) -> Path:
    """LLaDA2.x's layout (inclusionAI/LLaDA2.0-mini, LLaDA2.1-mini): model_type llada2_moe, the
    remote-code auto_map (never executed), no block field (its generate's block_length, 32, is the
    attention block unless bd_size is given), mask `<|mask|>` and `<|endoftext|>` found by name,
    partial rotary 0.5, sigmoid router with groups and expert bias, a shared expert."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = _write_tokenizer(folder, LLADA2_SPECIALS)
    cfg = {
        "architectures": ["LLaDA2MoeModelLM"], "model_type": "llada2_moe",
        "auto_map": {"AutoConfig": "configuration_llada2_moe.LLaDA2MoeConfig",
                     "AutoModelForCausalLM": "modeling_llada2_moe.LLaDA2MoeModelLM"},
        "vocab_size": len(vocab), "hidden_size": d, "intermediate_size": ff, "num_hidden_layers": layers,
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "hidden_act": "silu", "use_qkv_bias": False,
        "use_qk_norm": True, "use_bias": out_bias, "rms_norm_eps": 1e-6, "norm_head": False, "tie_word_embeddings": False,
        "max_position_embeddings": 8192, "rope_theta": 600000, "rope_scaling": None, "num_experts": experts,
        "num_shared_experts": shared, "num_experts_per_tok": top_k, "n_group": n_group, "topk_group": topk_group,
        "routed_scaling_factor": 2.5, "moe_intermediate_size": eff, "first_k_dense_replace": dense_layers,
        "head_dim": d // heads, "partial_rotary_factor": 0.5, "moe_router_enable_expert_bias": True,
        "score_function": "sigmoid", "use_sliding_window": False, "output_router_logits": False,
        "pad_token_id": vocab["<|endoftext|>"], "eos_token_id": vocab["<|endoftext|>"], "torch_dtype": "bfloat16",
        **extra,
    }
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": vocab["<|endoftext|>"]}))
    tok_cfg = {"eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>", "mask_token": "<|mask|>",
               "tokenizer_class": "PreTrainedTokenizerFast"}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    g = torch.Generator().manual_seed(seed)
    t = llada2_tensors(len(vocab), d, layers, heads, kv_heads, ff, experts, eff, shared, dense_layers, g,
                       out_bias=out_bias)
    t["lm_head.weight"][vocab["<|mask|>"]] = 0  # no model here prefers MASK (the reference would never finish)
    _save_sharded(folder, t, shards)
    return folder


def write_llada_moe(folder, d=32, layers=3, heads=4, ff=48, experts=8, top_k=2, eff=16, shared_ff=24, seed=0,
                    shards=2, moe_layer_freq=(0, 1, 1), expert_bias=True, bpe: bool = False, **extra) -> Path:
    """LLaDA-MoE's layout (inclusionAI/LLaDA-MoE-7B-A1B-Instruct): OLMoE-style keys (self_attn.{q,k,v,o}_proj,
    per-head q_norm / k_norm, mlp.gate, mlp.experts.{e}, mlp.expert_bias, shared_expert beside mlp),
    model_type "llada" with the LLaDAMoEModelLM architecture, a dense first layer (moe_layer_freq 0)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = _write_tokenizer(folder, LLADA_SPECIALS, bpe=bpe)
    V = len(vocab)
    cfg = {
        "architectures": ["LLaDAMoEModelLM"], "model_type": "llada",
        "auto_map": {"AutoConfig": "configuration_lladamoe.LLaDAMoEConfig", "AutoModel": "modeling_lladamoe.LLaDAMoEModelLM"},
        "vocab_size": V, "hidden_size": d, "dense_intermediate_size": ff, "expert_intermediate_size": eff,
        "shared_expert_intermediate_size": shared_ff, "num_hidden_layers": layers, "num_attention_heads": heads,
        "num_key_value_heads": heads, "hidden_act": "silu", "max_position_embeddings": 8192, "rms_norm_eps": 1e-5,
        "rope_theta": 50000, "partial_rotary_factor": 1, "attention_bias": False, "num_experts_per_tok": top_k,
        "num_experts": experts, "norm_topk_prob": True, "qk_layernorm": True, "moe_layer_freq": list(moe_layer_freq),
        "moe_router_enable_expert_bias": expert_bias, "moe_router_score_function": "softmax",
        "routed_scaling_factor": 1, "router_num_group": 1, "router_topk_group": 1, "tie_word_embeddings": False,
        "mask_token_id": vocab["<|mdm_mask|>"], "eos_token_id": vocab["<|endoftext|>"],
        "pad_token_id": vocab["<|endoftext|>"], **extra,
    }
    (folder / "config.json").write_text(json.dumps(cfg, indent=2))
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": vocab["<|endoftext|>"]}))
    tok_cfg = {"bos_token": "<|startoftext|>", "eos_token": "<|endoftext|>", "pad_token": "<|endoftext|>",
               "chat_template": LLADA_TEMPLATE, "tokenizer_class": "PreTrainedTokenizerFast"}
    (folder / "tokenizer_config.json").write_text(json.dumps(tok_cfg, indent=2))
    g = torch.Generator().manual_seed(seed)
    hd = d // heads
    r = lambda *s: torch.randn(*s, generator=g) * 0.3  # noqa: E731
    t = {"model.embed_tokens.weight": r(V, d) * 3}
    for i in range(layers):
        p = f"model.layers.{i}."
        t[p + "input_layernorm.weight"] = 1 + 0.1 * torch.randn(d, generator=g)
        t[p + "post_attention_layernorm.weight"] = 1 + 0.1 * torch.randn(d, generator=g)
        for n in ("q", "k", "v", "o"):
            t[p + f"self_attn.{n}_proj.weight"] = r(d, d)
        t[p + "self_attn.q_norm.weight"] = 1 + 0.1 * torch.randn(hd, generator=g)
        t[p + "self_attn.k_norm.weight"] = 1 + 0.1 * torch.randn(hd, generator=g)
        if moe_layer_freq[i] == 0:
            for n, shape in (("gate_proj", (ff, d)), ("up_proj", (ff, d)), ("down_proj", (d, ff))):
                t[p + f"mlp.{n}.weight"] = r(*shape)
            continue
        t[p + "mlp.gate.weight"] = r(experts, d) * 3
        if expert_bias:
            t[p + "mlp.expert_bias"] = 0.05 * torch.randn(experts, generator=g)
        for e in range(experts):
            for n, shape in (("gate_proj", (eff, d)), ("up_proj", (eff, d)), ("down_proj", (d, eff))):
                t[p + f"mlp.experts.{e}.{n}.weight"] = r(*shape)
        if shared_ff:
            for n, shape in (("gate_proj", (shared_ff, d)), ("up_proj", (shared_ff, d)), ("down_proj", (d, shared_ff))):
                t[p + f"shared_expert.{n}.weight"] = r(*shape)
    t["model.norm.weight"] = torch.ones(d)
    t["lm_head.weight"] = r(V, d) * 3
    t["lm_head.weight"][cfg["mask_token_id"]] = 0
    _save_sharded(folder, t, shards)
    return folder


GEMMA_SPECIALS = ["<pad>", "<eos>", "<bos>"]  # ids 0, 1, 2: the release's pad, eos and bos
GEMMA_TURNS = ["<start_of_turn>", "<end_of_turn>"]
GEMMA_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}<start_of_turn> {{ m['role'] }} {{ m['content'] }} <end_of_turn> "
    "{% endfor %}{% if add_generation_prompt %}<start_of_turn> assistant {% endif %}"
)


def write_diffusion_gemma(folder, canvas=16, layers=3, window=8, peaky=40.0, seed=0, generation=None,
                          layer_types=("sliding_attention", "full_attention", "full_attention"), full_kv_heads=1) -> Path:
    """A tiny DiffusionGemma checkpoint written by transformers' own save_pretrained (the released
    layout: text_config, per_layer_config, the vision tower's weights, the tied weights under the
    decoder's names), with a word-level tokenizer whose specials sit where Gemma's do.
    `peaky`: the (tied) embedding is scaled up so the random model's logits are sharp enough to
    accept many tokens per step and to stop early (a flat random model never does)."""
    from transformers import DiffusionGemmaConfig, DiffusionGemmaForBlockDiffusion

    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    torch.manual_seed(seed)
    text = dict(vocab_size=128, hidden_size=64, intermediate_size=96, num_hidden_layers=layers, num_attention_heads=4,
                num_key_value_heads=2, head_dim=16, global_head_dim=32, num_global_key_value_heads=full_kv_heads, num_experts=4,
                top_k_experts=2, moe_intermediate_size=32, sliding_window=window, layer_types=list(layer_types),
                max_position_embeddings=4096, pad_token_id=0, eos_token_id=1, bos_token_id=2)
    vision = dict(model_type="gemma4_vision", hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                  num_attention_heads=2, num_key_value_heads=2, head_dim=16, position_embedding_size=64)
    cfg = DiffusionGemmaConfig(text_config=text, vision_config=vision, canvas_length=canvas, image_token_id=125,
                               boi_token_id=126, eoi_token_id=127)
    model = DiffusionGemmaForBlockDiffusion(cfg).eval()
    with torch.no_grad():
        model.model.decoder.embed_tokens.weight.mul_(peaky)
        for i, layer in enumerate(model.model.decoder.layers):  # the two roles' own scalars differ
            layer.layer_scalar.fill_(0.7 + 0.1 * i)
        for layer in model.model.encoder.language_model.layers:
            layer.layer_scalar.fill_(1.2)
    model.save_pretrained(folder)
    vocab = {s: i for i, s in enumerate(GEMMA_SPECIALS + WORDS + GEMMA_TURNS)}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="?"))
    tok.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok.add_special_tokens(GEMMA_SPECIALS + GEMMA_TURNS)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps(
        {"bos_token": "<bos>", "eos_token": "<eos>", "pad_token": "<pad>", "chat_template": GEMMA_TEMPLATE}))
    gen = {"eos_token_id": [1, vocab["<end_of_turn>"]], "pad_token_id": 0, "bos_token_id": 2, **(generation or {})}
    path = folder / "generation_config.json"
    path.write_text(json.dumps({**json.loads(path.read_text()), **gen}, indent=2))
    return folder
