"""GGUF files (llama.cpp's format), read through the `gguf` package llama.cpp publishes.

A GGUF file holds a model's settings as metadata (`llada.block_count`, ...), its tensors under
llama.cpp's names (`blk.0.attn_q.weight`), each in a storage type (F32, F16, BF16, Q8_0, Q4_0,
Q4_K, Q5_K, Q6_K, ...), and its tokenizer (tokens, merges, special ids, chat template). unmask
reads the diffusion architectures llama.cpp's converter writes and unmask runs:

- `llada` (LLaDA; the converter permutes q and k for llama.cpp's rotary layout: undone here),
- `dream` (Dream),
- `llada-moe` (LLaDA-MoE, as llama.cpp runs it: every layer routed, softmax router weights not
  renormalised, no shared expert, no expert bias; the converter stacks each layer's experts into
  one tensor per projection, `blk.N.ffn_{gate,up,down}_exps`, read back expert by expert).

The settings become the family's config.json fields (so the model is built exactly as from its
safetensors release); each tensor is found by the name llama.cpp's own table gives the
release's (gguf.get_tensor_name_map, the table its converter uses) and read dequantized to
float32 (gguf.quants.dequantize, llama.cpp's reference dequantization). The tokenizer is rebuilt
from the file (GPT-2-style byte-level BPE: `tokenizer.ggml.model` "gpt2"). Strict: another
architecture, tokenizer model or storage type is refused by name."""

import math
import re
from pathlib import Path

import numpy as np
import torch

from unmask.errors import CheckpointError

# architecture -> how its settings become the release's config.json
ARCHITECTURES = ("llada", "dream", "llada-moe")
# a release's per-expert tensor (the stacked GGUF tensor's slice `expert`)
_EXPERT = re.compile(r"^(model\.layers\.\d+\.mlp\.experts)\.(\d+)\.(gate_proj|up_proj|down_proj)\.weight$")
TYPES = ("F32", "F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q2_K", "Q3_K", "Q4_K", "Q5_K", "Q6_K")


def is_gguf(path) -> bool:
    """Whether `path` is a GGUF file (by its magic number, not its name)."""
    p = Path(path)
    try:
        with open(p, "rb") as fh:
            return p.is_file() and fh.read(4) == b"GGUF"
    except OSError:
        return False


def _gguf():
    try:
        import gguf
    except ImportError:
        raise CheckpointError("reading a GGUF file needs the `gguf` package (pip install 'unmask[gguf]')") from None
    return gguf


class GGUFFile:
    """One GGUF file: its metadata, the release's config, tensors by the release's names, and its
    tokenizer. The file is memory-mapped (numpy) and read tensor by tensor."""

    def __init__(self, path) -> None:
        gguf = _gguf()
        self.path = Path(path)
        try:
            self.reader = gguf.GGUFReader(str(self.path))
        except (ValueError, OSError, KeyError, IndexError) as e:
            raise CheckpointError(f"{self.path}: not a GGUF file unmask can read ({type(e).__name__}: {e})") from None
        self.meta = {k: self._value(f) for k, f in self.reader.fields.items()}
        self.arch = str(self.meta.get("general.architecture", ""))
        if self.arch not in ARCHITECTURES:
            raise CheckpointError(f"{self.path}: GGUF architecture {self.arch!r} is not one unmask runs; it reads "
                                  f"{', '.join(ARCHITECTURES)} (other models: their safetensors release)")
        self.tensors = {t.name: t for t in self.reader.tensors}
        self._stacked: dict[str, torch.Tensor] = {}  # one layer's stacked experts, dequantized (read expert by expert)
        self._mapped = None  # the file mapped copy-on-write, once an F32 tensor is used as stored
        bad = sorted({t.tensor_type.name for t in self.reader.tensors} - set(TYPES))
        if bad:
            raise CheckpointError(f"{self.path}: tensor type {bad[0]} is not one unmask reads; it reads "
                                  f"{', '.join(TYPES)}")

    @staticmethod
    def _value(field):
        try:
            v = field.contents()
        except Exception:  # a field type this gguf version cannot decode: not one unmask reads
            return None
        return v

    def _need(self, key: str):
        v = self.meta.get(f"{self.arch}.{key}")
        if v is None:
            raise CheckpointError(f"{self.path}: GGUF metadata {self.arch}.{key} is missing")
        return v

    def config(self) -> dict:
        """The release's config.json fields, from the file's metadata."""
        a, m = self.arch, self.meta
        d, heads = int(self._need("embedding_length")), int(self._need("attention.head_count"))
        kv = int(m.get(f"{a}.attention.head_count_kv") or heads)
        layers = int(self._need("block_count"))
        ff = 0 if a == "llada-moe" else int(self._need("feed_forward_length"))  # a mixture's: its experts'
        vocab = int(m.get(f"{a}.vocab_size") or len(m.get("tokenizer.ggml.tokens") or []))
        theta = float(m.get(f"{a}.rope.freq_base") or 10000.0)
        # stored as float32: the decimal the release wrote (1e-05, not 9.999999747378752e-06)
        eps = float(str(np.float32(m.get(f"{a}.attention.layer_norm_rms_epsilon") or 1e-5)))
        ctx = int(m.get(f"{a}.context_length") or 4096)
        tied = "output.weight" not in self.tensors
        ids = {k: m.get(f"tokenizer.ggml.{g}_token_id") for k, g in
               (("mask_token_id", "mask"), ("eos_token_id", "eos"), ("bos_token_id", "bos"), ("pad_token_id", "padding"))}
        ids = {k: int(v) for k, v in ids.items() if v is not None}
        if m.get(f"{a}.rope.scaling.type") not in (None, "none"):
            raise CheckpointError(f"{self.path}: rope scaling {m.get(f'{a}.rope.scaling.type')!r} is not supported")
        if a == "llada":
            bias = "blk.0.attn_q.bias" in self.tensors
            return {"architectures": ["LLaDAModelLM"], "model_type": "llada", "d_model": d, "n_layers": layers,
                    "n_heads": heads, "n_kv_heads": kv, "mlp_hidden_size": ff, "vocab_size": vocab,
                    "embedding_size": vocab, "max_sequence_length": ctx, "rope": True, "rope_theta": theta,
                    "rms_norm_eps": eps, "layer_norm_type": "rms", "block_type": "llama", "activation_type": "silu",
                    "include_bias": False, "include_qkv_bias": bias, "weight_tying": tied, "alibi": False,
                    "scale_logits": False, "block_group_size": 1, **ids}
        if a == "llada-moe":
            return self._llada_moe(d, heads, kv, layers, vocab, theta, eps, ctx, tied, ids)
        return {"architectures": ["DreamModel"], "model_type": "Dream", "hidden_size": d, "num_hidden_layers": layers,
                "num_attention_heads": heads, "num_key_value_heads": kv, "intermediate_size": ff, "vocab_size": vocab,
                "rms_norm_eps": eps, "rope_theta": theta, "max_position_embeddings": ctx,
                "tie_word_embeddings": tied, **ids}

    def _llada_moe(self, d, heads, kv, layers, vocab, theta, eps, ctx, tied, ids) -> dict:
        """LLaDA-MoE's config.json fields as llama.cpp's graph computes the file (llama.cpp
        src/models/llada-moe.cpp): routed experts in every layer, softmax weights of the top k not
        renormalised, per-head q/k norms, no shared expert and no expert bias."""
        a, m = self.arch, self.meta
        head_dim = d // heads
        rot = int(m.get(f"{a}.rope.dimension_count") or head_dim)
        return {"architectures": ["LLaDAMoEModelLM"], "model_type": "llada", "hidden_size": d,
                "num_hidden_layers": layers, "num_attention_heads": heads, "num_key_value_heads": kv,
                "vocab_size": vocab, "max_position_embeddings": ctx, "rms_norm_eps": eps, "rope_theta": theta,
                "partial_rotary_factor": rot / head_dim, "num_experts": int(self._need("expert_count")),
                "num_experts_per_tok": int(self._need("expert_used_count")),
                "expert_intermediate_size": int(self._need("expert_feed_forward_length")),
                "moe_layer_freq": [1] * layers, "shared_expert_intermediate_size": 0,
                "moe_router_enable_expert_bias": False, "norm_topk_prob": False,
                "qk_layernorm": "blk.0.attn_q_norm.weight" in self.tensors,
                "attention_bias": "blk.0.attn_q.bias" in self.tensors, "tie_word_embeddings": tied, **ids}

    def names(self, wanted: list[str], layers: int) -> dict[str, str]:
        """The release's tensor names `wanted` -> this file's (llama.cpp's table); names the file
        does not hold are left out (the loader then names them as missing). A release's
        per-expert tensor maps to its expert's slice of the stacked tensor, "NAME#EXPERT"."""
        gguf = _gguf()
        table = gguf.get_tensor_name_map(getattr(gguf.MODEL_ARCH, self.arch.upper().replace("-", "_")), layers)
        out = {}
        for k in wanted:
            expert = _EXPERT.match(k)
            g = table.get_name(f"{expert[1]}.{expert[3]}.weight" if expert else k, try_suffixes=(".weight", ".bias"))
            if g is not None and g in self.tensors:
                out[k] = f"{g}#{expert[2]}" if expert else g
        return out

    def unmapped(self, mapped: dict[str, str]) -> list[str]:
        """The file's tensors no release name maps to (the loader refuses them by name)."""
        return sorted(set(self.tensors) - {v.split("#")[0] for v in mapped.values()})

    def read(self, name: str, release_name: str, cfg: dict, mapped: bool = False) -> torch.Tensor:
        """Tensor `name` dequantized to float32, in the release's layout (LLaDA's q and k
        unpermuted). `mapped`: an F32 tensor used as stored is the file's own pages, mapped
        copy-on-write (unmask.models.reading.Mapped), not a copy."""
        if "#" in name:  # one expert of a stacked tensor
            base, expert = name.split("#")
            return self._expert(base)[int(expert)]
        gguf = _gguf()
        t = self.tensors[name]
        kind = t.tensor_type
        shape = tuple(int(s) for s in reversed(t.shape.tolist()))  # GGUF lists dimensions fastest first
        if mapped and kind == gguf.GGMLQuantizationType.F32 and self._permuted_heads(name, cfg) is None and \
                int(t.data_offset) % 4 == 0 and math.prod(shape) > 0:
            from unmask.models.reading import Mapped

            if self._mapped is None:
                with open(self.path, "rb") as fh:
                    self._mapped = Mapped(fh)
            return self._mapped.tensor(self.path, name, int(t.data_offset), int(t.n_bytes), shape, torch.float32)
        if kind in (gguf.GGMLQuantizationType.F32, gguf.GGMLQuantizationType.F16):
            a = np.array(t.data, dtype=np.float32)  # a copy: the file stays mapped read-only
        else:
            a = gguf.quants.dequantize(np.asarray(t.data), kind).astype(np.float32, copy=False)
        out = torch.from_numpy(np.ascontiguousarray(a).reshape(shape))
        self._release(t)
        heads = self._permuted_heads(name, cfg)
        return out if heads is None else _unpermute(out, heads)

    def _expert(self, name: str) -> torch.Tensor:
        """Stacked tensor `name` (experts, out, in) dequantized, kept while its layer is read (a
        loader asks for its experts one by one; another layer's drops it)."""
        if name not in self._stacked:
            layer = name.split(".")[1]
            self._stacked = {k: v for k, v in self._stacked.items() if k.split(".")[1] == layer}
            self._stacked[name] = self.read(name, name, {})
        return self._stacked[name]

    def _permuted_heads(self, name: str, cfg: dict) -> int | None:
        """The head count of a tensor llama.cpp's converter permuted for its rotary layout (LLaDA's
        q and k), else None."""
        if self.arch == "llada" and name.startswith("blk.") and (".attn_q." in name or ".attn_k." in name):
            return cfg["n_heads"] if ".attn_q." in name else cfg["n_kv_heads"]
        return None

    def release(self, name: str) -> None:
        """Give back the mapped pages of tensor `name` (a reader copied it elsewhere)."""
        t = self.tensors.get(name.split("#")[0])
        if t is not None and self._mapped is not None and "#" not in name:
            self._mapped.release(int(t.data_offset), int(t.n_bytes))

    def _release(self, t) -> None:
        """Drop tensor `t`'s pages of the file mapping from this process once it has been copied
        out: the mapping is read-only and clean, so the pages stay in the page cache and come
        back if touched; without this a loaded file's every page stays resident beside the
        weights made from it (a 290 MiB F32 file peaked at 2.2x its size)."""
        mm = getattr(self.reader.data, "_mmap", None)
        if mm is not None:
            from unmask.models.reading import drop_pages

            drop_pages(mm, int(t.data_offset), int(t.n_bytes))

    def keeps_int4(self, name: str) -> bool:
        """Whether tensor `name` is stored in a 4-bit layout int4 keeps as stored (Q4_0, Q4_K; an
        expert's slice is dequantized: experts stay int8)."""
        gguf = _gguf()
        return "#" not in name and self.tensors[name].tensor_type in (gguf.GGMLQuantizationType.Q4_0,
                                                                      gguf.GGMLQuantizationType.Q4_K)

    def read_int4(self, name: str, cfg: dict) -> tuple:
        """A Q4_0 or Q4_K tensor as stored, in the release's layout: (nibbles (out, in) uint8 0..15
        meaning q - 8, scales (out, in/32) float32[, offsets (out, in/32) float32 for Q4_K: its
        minimums]) for unmask.layers.int4 (LLaDA's q and k rows unpermuted, as `read` does)."""
        from unmask.layers.int4 import from_q4_0_blocks, from_q4_k_blocks

        t = self.tensors[name]
        shape = tuple(int(s) for s in reversed(t.shape.tolist()))
        k = from_q4_k_blocks if t.tensor_type == _gguf().GGMLQuantizationType.Q4_K else from_q4_0_blocks
        parts = k(np.asarray(t.data), shape[0], shape[1])
        self._release(t)
        heads = self._permuted_heads(name, cfg)
        return parts if heads is None else tuple(_unpermute(x, heads) for x in parts)

    def tokenizer(self):
        """(tokenizers.Tokenizer, tokenizer_config fields, chat template) rebuilt from the file."""
        from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers, processors

        m = self.meta
        kind = m.get("tokenizer.ggml.model")
        if kind != "gpt2":
            raise CheckpointError(f"{self.path}: GGUF tokenizer model {kind!r} is not one unmask reads (it reads "
                                  "'gpt2', byte-level BPE)")
        tokens = [str(t) for t in m["tokenizer.ggml.tokens"]]
        types = [int(x) for x in (m.get("tokenizer.ggml.token_type") or [1] * len(tokens))]
        merges = [tuple(str(x).split(" ", 1)) for x in (m.get("tokenizer.ggml.merges") or [])]
        vocab: dict[str, int] = {}
        for i, t in enumerate(tokens):  # every id keeps its place (a special token's too: added below)
            vocab.setdefault(t, i)
        tok = Tokenizer(models.BPE(vocab=vocab, merges=merges, fuse_unk=False))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)
        tok.decoder = decoders.ByteLevel()
        # CONTROL (3) tokens are special, USER_DEFINED (4) added text; an added token already in
        # the vocabulary keeps its id
        tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                                for i, t in enumerate(tokens) if types[i] == 3])
        tok.add_tokens([AddedToken(t, special=False, normalized=False) for i, t in enumerate(tokens) if types[i] == 4])
        bos = m.get("tokenizer.ggml.bos_token_id")
        if m.get("tokenizer.ggml.add_bos_token") and bos is not None:  # as llama.cpp encodes this file's prompts
            b = tokens[int(bos)]
            tok.post_processor = processors.TemplateProcessing(single=f"{b} $A", pair=f"{b} $A $B",
                                                               special_tokens=[(b, int(bos))])
        name = lambda k: tokens[int(m[k])] if m.get(k) is not None else None  # noqa: E731
        cfg = {k: name(f"tokenizer.ggml.{g}_token_id") for k, g in
               (("bos_token", "bos"), ("eos_token", "eos"), ("pad_token", "padding"))}
        cfg = {k: v for k, v in cfg.items() if v is not None}
        return tok, cfg, m.get("tokenizer.chat_template")


def _unpermute(w: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of llama.cpp's converter's q/k permutation (its rotary layout, pairs of
    halves interleaved per head) -> the release's rows."""
    rows = w.shape[0]
    return w.reshape(heads, rows // heads // 2, 2, *w.shape[1:]).swapaxes(1, 2).reshape(w.shape)
