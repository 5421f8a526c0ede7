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


def _write_tokenizer(folder: Path, specials: list[str]) -> dict[str, int]:
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


def write_llada(folder, d=32, layers=2, heads=4, kv_heads=2, ff=64, seed=0, shards=2, max_len=512) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = _write_tokenizer(folder, LLADA_SPECIALS)
    V = len(vocab) + 3  # embedding_size may exceed the tokenizer's vocabulary, as in LLaDA-8B
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


def write_dream(folder, d=32, layers=2, heads=4, kv_heads=2, ff=64, seed=0, shards=2) -> Path:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    vocab = _write_tokenizer(folder, DREAM_SPECIALS)
    V = len(vocab)
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
