"""Independent reference implementations used only by the tests.

- RefModel: a plain forward written from the published architecture descriptions, with the
  Fast-dLLM KV-cache semantics (keys cached *before* RoPE and re-rotated on every call; prefix
  mode concatenates, dual mode overwrites `replace_position` in place).
- fastdllm_*: ports of Fast-dLLM v1 (latest) generate / prefix / dual-cache loops.
- llada_generate: port of LLaDA's official generate.
- dream_generate: port of Dream's diffusion_generate `_sample`.
They follow reference-semantics.md line by line and use the global torch RNG like upstream.
"""

import json
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from safetensors.torch import load_file

from unmask.kv.static import StaticKV
from unmask.canvas import Canvas, retire_rows
from unmask.models.base import DiffusionLM, TokenIds
from unmask.trace import Decoded, ForwardRecord


class RefModel:
    def __init__(self, folder):
        folder = Path(folder)
        self.cfg = json.loads((folder / "config.json").read_text())
        self.w = {}
        for f in sorted(folder.glob("*.safetensors")):
            self.w.update(load_file(str(f)))
        c = self.cfg
        self.dream = c["model_type"] == "Dream"
        if self.dream:
            self.L, self.H = c["num_hidden_layers"], c["num_attention_heads"]
            self.Hkv, self.eps, self.theta = c["num_key_value_heads"], c["rms_norm_eps"], c["rope_theta"]
            self.d = c["hidden_size"]
        else:
            self.L, self.H, self.Hkv = c["n_layers"], c["n_heads"], c["n_kv_heads"]
            self.eps, self.theta, self.d = c["rms_norm_eps"], c["rope_theta"], c["d_model"]
        self.hd = self.d // self.H

    def _names(self, i):
        if self.dream:
            p = f"model.layers.{i}."
            return dict(an=p + "input_layernorm", q=p + "self_attn.q_proj", k=p + "self_attn.k_proj",
                        v=p + "self_attn.v_proj", o=p + "self_attn.o_proj", fn=p + "post_attention_layernorm",
                        g=p + "mlp.gate_proj", u=p + "mlp.up_proj", dn=p + "mlp.down_proj")
        p = f"model.transformer.blocks.{i}."
        return dict(an=p + "attn_norm", q=p + "q_proj", k=p + "k_proj", v=p + "v_proj", o=p + "attn_out",
                    fn=p + "ff_norm", g=p + "ff_proj", u=p + "up_proj", dn=p + "ff_out")

    def _lin(self, x, name):
        y = x @ self.w[name + ".weight"].T
        b = self.w.get(name + ".bias")
        return y if b is None else y + b

    def _norm(self, x, name):
        xf = x.float()
        xf = xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)
        return self.w[name + ".weight"] * xf.to(x.dtype)

    def _rope(self, t, positions):
        inv = 1.0 / (self.theta ** (torch.arange(0, self.hd, 2, dtype=torch.float) / self.hd))
        freqs = torch.einsum("i , j -> i j", positions.float(), inv)
        emb = torch.cat((freqs, freqs), dim=-1)
        sin, cos = emb.sin()[None, None], emb.cos()[None, None]
        B, nh, T, hs = t.shape
        x1, x2 = t.view(B, nh, T, 2, hs // 2).unbind(dim=-2)
        rot = torch.cat((-x2, x1), dim=-1)
        return (t * cos + rot * sin).to(t.dtype)

    def __call__(self, x, past_key_values=None, replace_position=None, attention_bias=None, position_ids=None):
        """x (B, T) -> logits (B, T, V) (unshifted), present list of (K pre-RoPE, V)."""
        emb = "model.embed_tokens.weight" if self.dream else "model.transformer.wte.weight"
        h = self.w[emb][x]
        B, T = x.shape
        presents = []
        for i in range(self.L):
            n = self._names(i)
            a = self._norm(h, n["an"])
            q = self._lin(a, n["q"]).view(B, T, self.H, self.hd).transpose(1, 2)
            k = self._lin(a, n["k"]).view(B, T, self.Hkv, self.hd).transpose(1, 2)
            v = self._lin(a, n["v"]).view(B, T, self.Hkv, self.hd).transpose(1, 2)
            if past_key_values is not None:
                pk, pv = past_key_values[i]
                if replace_position is None:
                    k, v = torch.cat([pk, k], dim=2), torch.cat([pv, v], dim=2)
                else:
                    for b in range(B):
                        idx = replace_position[b].nonzero().squeeze(-1)
                        pk[b, :, idx] = k[b]
                        pv[b, :, idx] = v[b]
                    k, v = pk, pv
            presents.append((k, v))
            key_len = k.shape[2]
            if position_ids is not None:
                qpos = kpos = position_ids
                qr = torch.stack([self._rope(q[b : b + 1], qpos[b]) for b in range(B)])[:, 0]
                kr = torch.stack([self._rope(k[b : b + 1], kpos[b]) for b in range(B)])[:, 0]
            else:
                end = key_len if replace_position is None else int(replace_position[0].nonzero().max()) + 1
                qr = self._rope(q, torch.arange(end - T, end))
                kr = self._rope(k, torch.arange(key_len))
            rep = self.H // self.Hkv
            kr, vr = kr.repeat_interleave(rep, dim=1), v.repeat_interleave(rep, dim=1)
            att = F.scaled_dot_product_attention(qr, kr, vr, attn_mask=attention_bias, is_causal=False)
            h = h + self._lin(att.transpose(1, 2).reshape(B, T, self.d), n["o"])
            f = self._norm(h, n["fn"])
            h = h + self._lin(F.silu(self._lin(f, n["g"])) * self._lin(f, n["u"]), n["dn"])
        if self.dream:
            h = self._norm(h, "model.norm")
            return h @ self.w["lm_head.weight"].T, presents
        h = self._norm(h, "model.transformer.ln_f")
        return h @ self.w["model.transformer.ff_out.weight"].T, presents


# ---------------------------------------------------------------- LLaDA / Fast-dLLM ports

def add_gumbel_noise(logits, temperature):
    if temperature == 0:
        return logits
    logits = logits.to(torch.float64)
    noise = torch.rand_like(logits, dtype=torch.float64)
    gumbel_noise = (-torch.log(noise)) ** temperature
    return logits.exp() / gumbel_noise


def get_num_transfer_tokens(mask_index, steps):
    mask_num = mask_index.sum(dim=1, keepdim=True)
    base = mask_num // steps
    remainder = mask_num % steps
    num = torch.zeros(mask_num.size(0), steps, dtype=torch.int64) + base
    for i in range(mask_num.size(0)):
        num[i, : remainder[i]] += 1
    return num


def get_transfer_index(logits, temperature, remasking, mask_index, x, num_transfer_tokens, threshold=None):
    """Fast-dLLM latest (vectorised): sort-based top-k, threshold = (>= tau) plus argmax."""
    x0 = torch.argmax(add_gumbel_noise(logits, temperature), dim=-1)
    if remasking == "low_confidence":
        p = F.softmax(logits.to(torch.float64), dim=-1)
        x0_p = torch.gather(p, -1, x0.unsqueeze(-1)).squeeze(-1)
    else:
        x0_p = torch.rand(x0.shape, dtype=torch.float64)
    x0 = torch.where(mask_index, x0, x)
    confidence = torch.where(mask_index, x0_p, torch.tensor(-np.inf, dtype=x0_p.dtype))
    if threshold is not None:
        transfer = mask_index & (confidence >= threshold)
        best = confidence.argmax(dim=1)
        force = torch.zeros_like(transfer)
        force[torch.arange(x0.shape[0]), best] = True
        transfer = transfer | (force & mask_index)
        return x0, transfer
    order = torch.sort(confidence, dim=1, descending=True).indices
    transfer = torch.zeros_like(mask_index)
    for j in range(x0.shape[0]):
        k = int(num_transfer_tokens[j])
        transfer[j, order[j, :k]] = True
    return x0, transfer & mask_index


def get_transfer_index_dynamic(logits, temperature, remasking, mask_index, x, factor=1.0):
    x0 = torch.argmax(add_gumbel_noise(logits, temperature), dim=-1)
    if remasking == "low_confidence":
        p = F.softmax(logits.to(torch.float64), dim=-1)
        x0_p = torch.gather(p, -1, x0.unsqueeze(-1)).squeeze(-1)
    else:
        x0_p = torch.rand((x0.shape[0], x0.shape[1]))
    x0 = torch.where(mask_index, x0, x)
    confidence = torch.where(mask_index, x0_p, torch.tensor(-np.inf, dtype=x0_p.dtype))
    transfer = torch.zeros_like(x0, dtype=torch.bool)
    num = mask_index.sum(dim=1)
    for j in range(confidence.shape[0]):
        if num[j] == 0:
            continue
        ns = list(range(1, int(num[j]) + 1))
        threshs = [1 - factor / (n + 1) for n in ns]
        threshs[0] = -1
        sorted_conf = torch.sort(confidence[j][mask_index[j]], dim=-1, descending=True)[0]
        for top_i in range(len(threshs)):
            if sorted_conf[top_i] < threshs[top_i]:
                break
        if top_i == 0 or top_i == len(threshs) - 1:
            top_i += 1
        _, select = torch.topk(confidence[j], k=top_i)
        transfer[j, select] = True
    return x0, transfer


def _select(logits, temperature, remasking, mask_index, x, quota, threshold, factor):
    if factor is None:
        return get_transfer_index(logits, temperature, remasking, mask_index, x, quota if threshold is None else None, threshold)
    return get_transfer_index_dynamic(logits, temperature, remasking, mask_index, x, factor)


def _canvas(prompt, gen_length, mask_id, suffix=None):
    """The samplers' x: prompt + gen_length masks (+ `suffix`, the text after the hole, for
    infilling: the one change to what x holds; the loops below are unchanged)."""
    x = torch.full((prompt.shape[0], prompt.shape[1] + gen_length), mask_id, dtype=torch.long)
    x[:, : prompt.shape[1]] = prompt
    return x if suffix is None else torch.cat([x, suffix], 1)


@torch.no_grad()
def fastdllm_generate(model, prompt, steps, gen_length, block_length, temperature=0.0,
                      remasking="low_confidence", mask_id=0, threshold=None, factor=None, suffix=None):
    x = _canvas(prompt, gen_length, mask_id, suffix)
    num_blocks = gen_length // block_length
    spb = steps // num_blocks
    nfe = 0
    for nb in range(num_blocks):
        s = prompt.shape[1] + nb * block_length
        e = s + block_length
        quota = get_num_transfer_tokens(x[:, s:e] == mask_id, spb)
        i = 0
        while True:
            nfe += 1
            mask_index = x == mask_id
            logits = model(x)[0]
            mask_index[:, e:] = 0
            q = quota[:, i] if i < spb else None
            x0, tr = _select(logits, temperature, remasking, mask_index, x, q, threshold, factor)
            x[tr] = x0[tr]
            i += 1
            if (x[:, s:e] == mask_id).sum() == 0:
                break
    return x, nfe


@torch.no_grad()
def fastdllm_prefix(model, prompt, steps, gen_length, block_length, temperature=0.0,
                    remasking="low_confidence", mask_id=0, threshold=None, factor=None, suffix=None):
    x = _canvas(prompt, gen_length, mask_id, suffix)
    num_blocks = gen_length // block_length
    spb = steps // num_blocks
    nfe = 0
    for nb in range(num_blocks):
        s = prompt.shape[1] + nb * block_length
        e = s + block_length
        quota = get_num_transfer_tokens(x[:, s:e] == mask_id, spb)
        logits, past = model(x)
        mask_index = x == mask_id
        mask_index[:, e:] = 0
        x0, tr = _select(logits, temperature, remasking, mask_index, x, quota[:, 0], threshold, factor)
        x[tr] = x0[tr]
        past = [(k[:, :, :s], v[:, :, :s]) for k, v in past]
        nfe += 1
        i = 1
        while (x[:, s:e] == mask_id).sum() > 0:
            nfe += 1
            mask_index = x[:, s:] == mask_id
            mask_index[:, block_length:] = 0
            logits, _ = model(x[:, s:], past_key_values=past)
            q = quota[:, i] if i < spb else None
            x0, tr = _select(logits, temperature, remasking, mask_index, x[:, s:], q, threshold, factor)
            x[:, s:][tr] = x0[tr]
            i += 1
    return x, nfe


@torch.no_grad()
def fastdllm_dual(model, prompt, steps, gen_length, block_length, temperature=0.0,
                  remasking="low_confidence", mask_id=0, threshold=None, factor=None, suffix=None):
    """Latest upstream: at most steps_per_block forwards per block (masks can survive)."""
    x = _canvas(prompt, gen_length, mask_id, suffix)
    num_blocks = gen_length // block_length
    spb = steps // num_blocks
    nfe = 0
    for nb in range(num_blocks):
        s = prompt.shape[1] + nb * block_length
        e = s + block_length
        quota = get_num_transfer_tokens(x[:, s:e] == mask_id, spb)
        logits, past = model(x)
        mask_index = x == mask_id
        mask_index[:, e:] = 0
        x0, tr = _select(logits, temperature, remasking, mask_index, x, quota[:, 0], threshold, factor)
        x[tr] = x0[tr]
        nfe += 1
        replace = torch.zeros_like(x, dtype=torch.bool)
        replace[:, s:e] = 1
        for i in range(1, spb):
            if (x[:, s:e] == mask_id).sum() == 0:
                break
            nfe += 1
            mask_index = x[:, s:e] == mask_id
            logits, _ = model(x[:, s:e], past_key_values=past, replace_position=replace)
            x0, tr = _select(logits, temperature, remasking, mask_index, x[:, s:e], quota[:, i], threshold, factor)
            x[:, s:e][tr] = x0[tr]
    return x, nfe


@torch.no_grad()
def llada_generate(model, prompt, steps, gen_length, block_length, temperature=0.0,
                   remasking="low_confidence", mask_id=0, suffix=None):
    """LLaDA official generate (no CFG, no attention mask)."""
    x = _canvas(prompt, gen_length, mask_id, suffix)
    num_blocks = gen_length // block_length
    spb = steps // num_blocks
    for nb in range(num_blocks):
        block_mask = x[:, prompt.shape[1] + nb * block_length : prompt.shape[1] + (nb + 1) * block_length] == mask_id
        quota = get_num_transfer_tokens(block_mask, spb)
        for i in range(spb):
            mask_index = x == mask_id
            logits = model(x)[0]
            x0 = torch.argmax(add_gumbel_noise(logits, temperature), dim=-1)
            if remasking == "low_confidence":
                p = F.softmax(logits, dim=-1)
                x0_p = torch.squeeze(torch.gather(p, dim=-1, index=torch.unsqueeze(x0, -1)), -1)
            else:
                x0_p = torch.rand((x0.shape[0], x0.shape[1]))
            x0_p[:, prompt.shape[1] + (nb + 1) * block_length :] = -np.inf
            x0 = torch.where(mask_index, x0, x)
            confidence = torch.where(mask_index, x0_p, -np.inf)
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            for j in range(confidence.shape[0]):
                _, sel = torch.topk(confidence[j], k=int(quota[j, i]))
                transfer[j, sel] = True
            x[transfer] = x0[transfer]
    return x


# ---------------------------------------------------------------- Dream port

def _sample_tokens(logits, temperature=0.0, margin_confidence=False, neg_entropy=False):
    probs = torch.softmax(logits, dim=-1)
    confidence, x0 = probs.max(dim=-1)
    if margin_confidence:
        sp, _ = torch.sort(probs, dim=-1, descending=True)
        confidence = sp[:, 0] - sp[:, 1]
    if neg_entropy:
        confidence = torch.sum(probs * torch.log(probs + 1e-10), dim=-1)
    return confidence, x0


@torch.no_grad()
def dream_generate(model, prompt, max_new_tokens, steps, alg="origin", eps=1e-3, mask_token_id=0):
    """Dream `_sample`, greedy (temperature 0, no top-p/k, alg_temp None), unpadded prompts."""
    x = F.pad(prompt, (0, max_new_tokens), value=mask_token_id)
    timesteps = torch.linspace(1, eps, steps + 1)
    for i in range(steps):
        mask_index = x == mask_token_id
        logits = model(x)[0]
        logits = torch.cat([logits[:, :1], logits[:, :-1]], dim=1)
        mask_logits = logits[mask_index]
        t, s = timesteps[i], timesteps[i + 1]
        if alg == "origin":
            p_transfer = 1 - s / t if i < steps - 1 else 1
            x0 = torch.zeros_like(x[mask_index], dtype=torch.long) + mask_token_id
            transfer = torch.rand(*x0.shape) < p_transfer
            _, x0[transfer] = _sample_tokens(mask_logits[transfer])
            x[mask_index] = x0.clone()
        else:
            confidence, x0 = _sample_tokens(mask_logits, margin_confidence=alg == "topk_margin",
                                            neg_entropy=alg == "entropy")
            num_mask_token = mask_index.sum() / mask_index.shape[0]
            n = int(num_mask_token * (1 - s / t)) if i < steps - 1 else int(num_mask_token)
            full_conf = torch.full_like(x, -torch.inf, dtype=logits.dtype)
            full_conf[mask_index] = confidence
            if n > 0:
                _, transfer_index = torch.topk(full_conf, n)
                x_ = torch.zeros_like(x) + mask_token_id
                x_[mask_index] = x0.clone()
                rows = torch.arange(x.size(0)).unsqueeze(1).expand_as(transfer_index)
                x[rows, transfer_index] = x_[rows, transfer_index]
    return x


# ---------------------------------------------------------------- Fast-dLLM v2 port

class QwenBlockRef:
    """A Qwen2-layout forward with Fast-dLLM v2's cache semantics, written from the architecture
    description: keys cached *after* RoPE in a DynamicCache-like list that grows only when
    `update_past_key_values` is set; a block-level cache whose entries at `replace_position`
    are overwritten by the forwarded sub-block. Attention: a key at position k is visible to a
    query at position q iff k // bd_size <= q // bd_size."""

    def __init__(self, folder):
        folder = Path(folder)
        self.cfg = c = json.loads((folder / "config.json").read_text())
        self.w = {}
        for f in sorted(folder.glob("*.safetensors")):
            self.w.update(load_file(str(f)))
        self.L, self.H, self.Hkv = c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]
        self.d, self.eps, self.theta, self.bd = c["hidden_size"], c["rms_norm_eps"], c["rope_theta"], c["bd_size"]
        self.hd = self.d // self.H

    def _lin(self, x, name):
        y = x @ self.w[name + ".weight"].T
        b = self.w.get(name + ".bias")
        return y if b is None else y + b

    def _norm(self, x, name):
        xf = x.float()
        return self.w[name + ".weight"] * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def _rope(self, t, positions):
        inv = 1.0 / (self.theta ** (torch.arange(0, self.hd, 2, dtype=torch.float) / self.hd))
        emb = torch.cat([positions.float()[:, None] * inv] * 2, dim=-1)
        x1, x2 = t[..., : self.hd // 2], t[..., self.hd // 2 :]
        return t * emb.cos() + torch.cat((-x2, x1), dim=-1) * emb.sin()

    def forward(self, x, start, past=None, update_past_key_values=False, block_past=None, replace_position=None):
        """x (B, T) at positions start..start+T-1. past: list of (K, V) of positions [0, start) (or
        of [0, block start) when block_past is given: then block_past holds the current block's
        K/V, and the forwarded columns overwrite it from `replace_position`). Returns logits
        (B, T, V), the new past (grown only with update_past_key_values), and the block's K/V."""
        B, T = x.shape
        h = self.w["model.embed_tokens.weight"][x]
        qpos = torch.arange(start, start + T)
        new_past, new_block = [], []
        for i in range(self.L):
            p = f"model.layers.{i}."
            a = self._norm(h, p + "input_layernorm")
            q = self._lin(a, p + "self_attn.q_proj").view(B, T, self.H, self.hd).transpose(1, 2)
            k = self._lin(a, p + "self_attn.k_proj").view(B, T, self.Hkv, self.hd).transpose(1, 2)
            v = self._lin(a, p + "self_attn.v_proj").view(B, T, self.Hkv, self.hd).transpose(1, 2)
            q, k = self._rope(q, qpos), self._rope(k, qpos)
            if block_past is not None:
                bk, bv = block_past[i][0].clone(), block_past[i][1].clone()
                bk[:, :, replace_position : replace_position + T] = k
                bv[:, :, replace_position : replace_position + T] = v
                pk, pv = past[i] if past is not None else (k[:, :, :0], v[:, :, :0])
                keys, vals = torch.cat([pk, bk], 2), torch.cat([pv, bv], 2)
                kpos = torch.arange(keys.shape[2])
                new_block.append((bk, bv))
            else:
                pk, pv = past[i] if past is not None else (k[:, :, :0], v[:, :, :0])
                keys, vals = torch.cat([pk, k], 2), torch.cat([pv, v], 2)
                kpos = torch.cat([torch.arange(pk.shape[2]), qpos])
                new_block.append((k, v))
            new_past.append((keys, vals) if update_past_key_values else (pk, pv))
            allowed = (kpos[None, :] // self.bd) <= (qpos[:, None] // self.bd)
            rep = self.H // self.Hkv
            att = F.scaled_dot_product_attention(q, keys.repeat_interleave(rep, 1), vals.repeat_interleave(rep, 1),
                                                 attn_mask=allowed)
            h = h + self._lin(att.transpose(1, 2).reshape(B, T, self.H * self.hd), p + "self_attn.o_proj")
            f = self._norm(h, p + "post_attention_layernorm")
            h = h + self._lin(F.silu(self._lin(f, p + "mlp.gate_proj")) * self._lin(f, p + "mlp.up_proj"),
                              p + "mlp.down_proj")
        logits = self._norm(h, "model.norm") @ self.w["lm_head.weight"].T
        return logits, new_past, new_block


def fast_dllm_v2_batch_sample(model, input_ids, seq_len, block_size, max_new_tokens, small_block_size, mask_id,
                              threshold, stop_token, pad_token_id, use_block_cache=False):
    """Port of Fast-dLLM v2 `batch_sample` at temperature 0, from reference-semantics.md §7 / §7.1.
    input_ids (B, max_len) right-padded with mask_id; seq_len: true lengths. Returns the output
    rows (lists, each to its own end) and the number of forward calls each row took part in."""
    bs = block_size
    B = input_ids.shape[0]
    min_len = int(seq_len.min())
    num_blocks = max_new_tokens // bs + input_ids.shape[1] // bs
    x = input_ids.clone()
    alive = list(range(B))
    outputs, nfe = {}, [0] * B
    past = None
    prefill_len = (min_len // bs) * bs if min_len > bs else 0  # only prompts longer than a block are prefilled
    seq_block = [int(n) // bs for n in seq_len]
    # upstream's input_ids width: what it writes each block's x_t back into decides which rows
    # take the seal forward's next token (see below)
    width_in = input_ids.shape[1]
    if prefill_len > 0:
        logits, past, _ = model.forward(x[:, :prefill_len], 0, None, update_past_key_values=True)
        for r in alive:
            nfe[r] += 1
        if min_len % bs == 0:
            nxt = logits[:, -1].argmax(-1)
            for j in range(B):
                if int(seq_len[j]) == min_len:
                    if x.shape[1] == min_len:
                        x = torch.cat([x, torch.full((B, 1), mask_id)], 1)
                        width_in = min_len + 1
                    x[j, min_len] = nxt[j]
    finished = [False] * B
    for blk in range(prefill_len // bs, num_blocks):
        start = blk * bs
        if x.shape[1] < start + bs:
            x = torch.cat([x, torch.full((x.shape[0], start + bs - x.shape[1]), mask_id)], 1)
        block_past = None
        for sb in range(bs // small_block_size):
            s, e = sb * small_block_size, (sb + 1) * small_block_size
            while (x[:, start + s : start + e] == mask_id).any():
                if use_block_cache and block_past is not None and not (x[:, start + s] == mask_id).any():
                    logits, _, block_past = model.forward(x[:, start + s : start + e], start + s, past,
                                                          block_past=block_past, replace_position=s)
                    logits = torch.cat([logits[:, :1], logits[:, :-1]], 1)
                else:
                    logits, _, blk_kv = model.forward(x[:, start : start + bs], start, past)
                    if use_block_cache:
                        block_past = blk_kv
                    logits = torch.cat([logits[:, :1], logits[:, :-1]], 1)[:, s:e]
                for r in alive:
                    nfe[r] += 1
                probs = torch.softmax(logits, -1)
                p, x0 = probs.max(-1)
                for j in range(x.shape[0]):
                    cur = x[j, start + s : start + e]
                    m = cur == mask_id
                    if not m.any():
                        continue
                    conf = torch.where(m, p[j], torch.tensor(-float("inf")))
                    take = conf > threshold
                    take[int(conf.argmax())] = True
                    take &= m
                    cur[take] = x0[j][take]
                    if (x0[j][take] == stop_token).any():
                        finished[alive[j]] = True
        for j in range(x.shape[0]):
            r = alive[j]
            if finished[r]:
                after = (x[j, int(seq_len[j]) :] == stop_token).nonzero()
                if len(after):
                    first = int(seq_len[j]) + int(after[0])
                    x[j, first + 1 :] = pad_token_id
        if all(finished[r] for r in alive):
            for j, r in enumerate(alive):
                outputs[r] = x[j, : start + bs].tolist()
            alive = []
            break
        logits, past, _ = model.forward(x[:, start : start + bs], start, past, update_past_key_values=True)
        for r in alive:
            nfe[r] += 1
        nxt = logits[:, -1].argmax(-1)
        if x.shape[1] == start + bs:
            x = torch.cat([x, torch.full((x.shape[0], 1), mask_id)], 1)
        # upstream: `input_ids = x_t` when every row's block index is this block, or when input_ids
        # is at most one column wider than the block (then every row takes the token, even a row
        # whose prompt token sits there); otherwise only rows whose prompt ends in this block do
        everyone = all(seq_block[r] == blk for r in alive) or width_in <= start + bs + 1
        if everyone:
            width_in = start + bs + 1
        for j, r in enumerate(alive):
            if finished[r]:
                x[j, start + bs] = pad_token_id
            elif everyone or seq_block[r] == blk:
                x[j, start + bs] = nxt[j]
        for r in alive:
            if seq_block[r] == blk:
                seq_block[r] = blk + 1
        keep = [j for j, r in enumerate(alive) if not finished[r]]
        for j, r in enumerate(alive):
            if finished[r]:
                outputs[r] = x[j, : start + bs + 1].tolist()
        if len(keep) < len(alive):
            x, seq_len = x[keep], seq_len[keep]
            past = [(k[keep], v[keep]) for k, v in past]
            alive = [alive[j] for j in keep]
    for j, r in enumerate(alive):
        outputs[r] = x[j, : num_blocks * bs + 1].tolist()
    return [outputs[r] for r in range(B)], nfe


# ---------------------------------------------------------------- the AR twin's former loop

def decode_ar(model, tokens, prompts, max_new_tokens, temperature=0.0, seed=None):
    """Greedy next-token decoding with a KV cache on the left-padded canvas, one batch in
    lockstep: the AR twin's dedicated offline loop until the request engine proved as fast per
    forward (benchmarks/ar_offline.py). Kept as an independent reference for the engine's
    causal cache."""
    return _decode_ar(model, tokens, prompts, max_new_tokens, temperature, seed)


def _next_token(logits: torch.Tensor, mask_id: int, temperature: float, gen) -> torch.Tensor:
    logits = logits.float().clone()
    logits[:, mask_id] = -torch.inf
    if temperature > 0:
        u = torch.rand(logits.shape, dtype=torch.float64, generator=gen, device=logits.device)
        return (logits.double().exp() / (-torch.log(u)) ** temperature).argmax(-1)
    return logits.argmax(-1)


@torch.inference_mode()
def _decode_ar(
    model: DiffusionLM,
    tokens: TokenIds,
    prompts: list[list[int]],
    max_new_tokens: int,
    temperature: float = 0.0,
    seed: int | None = None,
) -> Decoded:
    if not model.config.causal:
        raise ValueError("autoregressive decoding needs a causal model (config 'causal': true)")
    device = next(model.parameters()).device
    pad = tokens.pad if tokens.pad is not None else tokens.eos
    c = Canvas.build(prompts, max_new_tokens, tokens.mask, pad, device)
    P, L, B0 = c.prompt_len, c.length, c.batch
    out = c.x.clone()
    stops = torch.tensor(tokens.stop, device=device)
    gen = torch.Generator(device).manual_seed(seed) if seed is not None else None
    kv = StaticKV(model.config.num_layers, L)
    row_nfe = torch.zeros(B0, dtype=torch.long, device=device)
    steps: list[ForwardRecord] = []
    start, width = 0, P  # first forward: the whole prompt
    for t in range(P, L):
        t0 = time.perf_counter()
        logits = model(c.x[:, start : start + width], c.positions[:, start : start + width], kv, start,
                       c.key_mask, slice(width - 1, width))
        c.x[:, t] = _next_token(logits[:, -1], tokens.mask, temperature, gen)
        row_nfe.index_add_(0, c.rows, torch.ones_like(c.rows))
        done = torch.isin(c.x[:, t], stops)
        any_done = bool(done.any())
        steps.append(ForwardRecord("full" if t == P else "window", c.batch, width, c.batch, block=0))
        if any_done:
            retire_rows(c, out, done, kv)
        steps[-1].seconds = time.perf_counter() - t0
        if c.batch == 0:
            break
        start, width = t, 1
    if c.batch:
        out[c.rows] = c.x
    nfe = row_nfe.tolist()
    return Decoded(out[:, P:].tolist(), nfe, [[1] * n for n in nfe], steps, "causal", P)


# ---------------------------------------------------------------- LLaDA2.x / LLaDA-MoE

class MoERef:
    """LLaDA2.x and LLaDA-MoE forwards written from the published modeling code's description, one
    token at a time through its experts (no sorting, no grouped multiply): fused or separate
    q/k/v, per-head RMSNorm of q and k, rotary on the first `partial_rotary_factor` of each head,
    routers as each family's modeling code computes them. `attn_mask` (T, T) bool, True = attend."""

    def __init__(self, folder):
        folder = Path(folder)
        self.cfg = c = json.loads((folder / "config.json").read_text())
        self.w = {}
        for f in sorted(folder.glob("*.safetensors")):
            self.w.update(load_file(str(f)))
        self.llada2 = c["model_type"] == "llada2_moe"
        self.L, self.H, self.Hkv = c["num_hidden_layers"], c["num_attention_heads"], c["num_key_value_heads"]
        self.d, self.eps, self.theta = c["hidden_size"], c["rms_norm_eps"], c["rope_theta"]
        self.hd = self.d // self.H
        self.rot = int(self.hd * c.get("partial_rotary_factor", 1.0))

    def _lin(self, x, name):
        y = x @ self.w[name + ".weight"].T
        b = self.w.get(name + ".bias")
        return y if b is None else y + b

    def _norm(self, x, weight):
        xf = x.float()
        return weight * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + self.eps)).to(x.dtype)

    def _rope(self, t, positions):
        r = self.rot
        inv = 1.0 / (self.theta ** (torch.arange(0, r, 2, dtype=torch.float) / r))
        emb = torch.cat([positions.float()[:, None] * inv] * 2, dim=-1)
        a, rest = t[..., :r], t[..., r:]
        x1, x2 = a[..., : r // 2], a[..., r // 2 :]
        return torch.cat([a * emb.cos() + torch.cat((-x2, x1), dim=-1) * emb.sin(), rest], dim=-1)

    def _mlp(self, x, p):
        return self._lin(F.silu(self._lin(x, p + "gate_proj")) * self._lin(x, p + "up_proj"), p + "down_proj")

    def _moe_token(self, x, p):
        """One token (d,) through the router and its chosen experts."""
        c = self.cfg
        logits = self.w[p + "gate.weight"].float() @ x.float()
        E, k = c["num_experts"], c["num_experts_per_tok"]
        if self.llada2:
            scores = torch.sigmoid(logits)
            biased = scores + self.w[p + "gate.expert_bias"]
            g = c.get("n_group", 1)
            per = E // g
            group_score = [sorted(biased[j * per:(j + 1) * per].tolist(), reverse=True)[:2] for j in range(g)]
            group_score = torch.tensor([sum(s) for s in group_score])
            keep_groups = set(torch.topk(group_score, c.get("topk_group", 1)).indices.tolist())
            allowed = [e for e in range(E) if e // per in keep_groups]
            chosen = sorted(allowed, key=lambda e: -float(biased[e]))[:k]
            w = scores[chosen]
            w = w / (w.sum() + 1e-20) if k > 1 else w
            w = w * c.get("routed_scaling_factor", 1.0)
        else:
            scores = torch.softmax(logits, -1)
            if p + "expert_bias" in self.w:
                scores = scores + self.w[p + "expert_bias"]
            chosen = sorted(range(E), key=lambda e: -float(scores[e]))[:k]
            w = scores[chosen]
        out = torch.zeros_like(x)
        for e, we in zip(chosen, w):
            out = out + we * self._mlp(x, p + f"experts.{e}.")
        return out

    def __call__(self, x, positions, attn_mask=None):
        """x (B, T) -> logits (B, T, V)."""
        c = self.cfg
        emb = "model.word_embeddings.weight" if self.llada2 else "model.embed_tokens.weight"
        h = self.w[emb][x]
        B, T = x.shape
        for i in range(self.L):
            p = f"model.layers.{i}."
            a = self._norm(h, self.w[p + "input_layernorm.weight"])
            if self.llada2:
                qkv = self._lin(a, p + "attention.query_key_value").view(B, T, self.H + 2 * self.Hkv, self.hd)
                q, k, v = qkv[:, :, : self.H], qkv[:, :, self.H : self.H + self.Hkv], qkv[:, :, self.H + self.Hkv :]
                qn, kn, o = p + "attention.query_layernorm.weight", p + "attention.key_layernorm.weight", p + "attention.dense"
            else:
                q = self._lin(a, p + "self_attn.q_proj").view(B, T, self.H, self.hd)
                k = self._lin(a, p + "self_attn.k_proj").view(B, T, self.Hkv, self.hd)
                v = self._lin(a, p + "self_attn.v_proj").view(B, T, self.Hkv, self.hd)
                qn, kn, o = p + "self_attn.q_norm.weight", p + "self_attn.k_norm.weight", p + "self_attn.o_proj"
            if qn in self.w:
                q, k = self._norm(q, self.w[qn]), self._norm(k, self.w[kn])
            q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
            q = torch.stack([self._rope(q[b], positions[b]) for b in range(B)])
            k = torch.stack([self._rope(k[b], positions[b]) for b in range(B)])
            rep = self.H // self.Hkv
            att = F.scaled_dot_product_attention(q, k.repeat_interleave(rep, 1), v.repeat_interleave(rep, 1),
                                                 attn_mask=attn_mask)
            h = h + self._lin(att.transpose(1, 2).reshape(B, T, self.H * self.hd), o)
            f = self._norm(h, self.w[p + "post_attention_layernorm.weight"])
            if p + "mlp.gate.weight" in self.w:
                y = torch.stack([torch.stack([self._moe_token(f[b, t], p + "mlp.") for t in range(T)])
                                 for b in range(B)])
                shared = p + ("mlp.shared_experts." if self.llada2 else "shared_expert.")
                if shared + "gate_proj.weight" in self.w:
                    y = y + self._mlp(f, shared)
            else:
                y = self._mlp(f, p + "mlp.")
            h = h + y
        return self._norm(h, self.w["model.norm.weight"]) @ self.w["lm_head.weight"].T


def llada2_generate(model, prompt, gen_length, block_length, threshold, editing_threshold, max_post_steps,
                    eos_early_stop, eos_id, mask_id, num_to_transfer=1):
    """Port of LLaDA2.1's `generate` (modeling_llada2_moe.py), greedy, one prompt, line by line;
    `model(x, positions, attn_mask)` returns logits. Returns (generated ids, forwards)."""
    forwards = 0
    prompt_length = len(prompt)
    num_blocks = (prompt_length + gen_length + block_length - 1) // block_length
    total_length = num_blocks * block_length
    block_mask = torch.tril(torch.ones(num_blocks, num_blocks))
    attn = block_mask.repeat_interleave(block_length, 0).repeat_interleave(block_length, 1).bool()
    position_ids = torch.arange(total_length)[None]
    x = torch.full((1, total_length), mask_id, dtype=torch.long)
    x[0, :prompt_length] = torch.tensor(prompt)
    prefill_blocks = prompt_length // block_length
    for num_block in range(prefill_blocks, num_blocks):
        end = (num_block + 1) * block_length
        cur_x = x[:, :end]
        block_start = num_block * block_length
        post_steps = 0
        while True:
            old = cur_x[:, -block_length:].clone()
            active = cur_x[:, -block_length:] == mask_id
            if not active.any():
                post_steps += 1
            if post_steps > max_post_steps:
                break
            prompt_in_block = torch.zeros(block_length, dtype=torch.bool)
            if block_start < prompt_length:
                prompt_in_block[: min(prompt_length - block_start, block_length)] = True
            logits = model(cur_x, position_ids[:, :end], attn[:end, :end])
            forwards += 1
            probs = F.softmax(logits[:, -block_length:].float(), dim=-1)
            x0 = probs.argmax(-1)
            x0_p = probs.gather(-1, x0[..., None]).squeeze(-1)
            transfer = torch.zeros_like(x0, dtype=torch.bool)
            if active.sum() > 0:
                conf = torch.where(active, x0_p, -torch.inf)
                high = (conf[0] > threshold) & active[0]
                if high.sum().item() >= num_to_transfer:
                    transfer[0] = high
                else:
                    _, idx = torch.topk(conf[0], k=min(num_to_transfer, int(active.sum())))
                    transfer[0, idx] = True
            editable = ~active & ~prompt_in_block[None, :]
            edit_conf = torch.where(editable, x0_p, -torch.inf)
            edit = (edit_conf[0] > editing_threshold) & editable[0] & (x0[0] != old[0])
            final = transfer.clone()
            final[0] |= edit
            if final.any():
                cur_x[:, -block_length:][final] = x0[final]
            if active.sum() == 0 and not edit.any():
                break
        x[:, :end] = cur_x
        if eos_early_stop:
            gen = x[0, prompt_length:end]
            if (gen == mask_id).sum() == 0 and (gen == eos_id).any():
                break
    answer = x[0, prompt_length : prompt_length + gen_length].tolist()
    if eos_id in answer:
        answer = answer[: answer.index(eos_id) + 1]
    return answer, forwards
