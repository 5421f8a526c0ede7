"""The engine's models against an independent plain forward, through the real loader."""

import pytest
import torch

from checkpoints import write_dream, write_llada
from reference import RefModel
from unmask.kv.static import StaticKV
from unmask.models import load_model


pytestmark = pytest.mark.usefixtures("plain_kernel")  # references at 1e-5: both sides on F.linear


def _full(model, x):
    pos = torch.arange(x.shape[1])[None].expand_as(x)
    return model(x, pos)


@pytest.mark.parametrize("kv_heads", [4, 2])
def test_llada_logits_match_reference(tmp_path, kv_heads):
    folder = write_llada(tmp_path, kv_heads=kv_heads, seed=1)
    model, _ = load_model(folder)
    ref = RefModel(folder)
    x = torch.randint(0, 50, (2, 23))
    torch.testing.assert_close(_full(model, x), ref(x)[0], atol=1e-5, rtol=1e-5)


def test_dream_logits_match_reference(tmp_path):
    folder = write_dream(tmp_path, seed=2)
    model, _ = load_model(folder)
    assert model.config.logit_shift == 1 and model.config.qkv_bias
    ref = RefModel(folder)
    x = torch.randint(0, 50, (2, 19))
    torch.testing.assert_close(_full(model, x), ref(x)[0], atol=1e-5, rtol=1e-5)


def test_logits_slice_selects_hidden_positions(llada):
    x = torch.randint(0, 50, (1, 20))
    pos = torch.arange(20)[None]
    full = llada.model(x, pos)
    torch.testing.assert_close(llada.model(x, pos, logits_slice=slice(5, 9)), full[:, 5:9])


def test_left_padding_is_masked_and_positions_start_at_first_token(llada):
    """A left-padded row gives the same logits as the prompt alone (the reference attends to pads)."""
    m = llada.model
    x = torch.randint(0, 50, (1, 12))
    alone = _full(m, x)
    padded = torch.cat([torch.full((1, 5), 51), x], dim=1)
    pos = (torch.arange(17) - 5).clamp(min=0)[None]
    key_mask = (torch.arange(17) >= 5)[None]
    torch.testing.assert_close(m(padded, pos, key_mask=key_mask)[:, 5:], alone, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("family", ["llada", "dream"])
def test_cached_window_equals_full_forward_when_exact(tmp_path, family):
    """A refresh through the KV buffer equals a plain forward; a prefix or dual window against
    a cache built from the same canvas equals the same columns of the full forward."""
    folder = (write_llada if family == "llada" else write_dream)(tmp_path, seed=3)
    model, _ = load_model(folder)
    x = torch.randint(0, 50, (2, 30))
    pos = torch.arange(30)[None].expand(2, -1)
    full = model(x, pos)
    kv = StaticKV(model.config.num_layers, 30)
    torch.testing.assert_close(model(x, pos, kv, 0), full)
    s, e = 14, 22
    prefix = model(x[:, s:], pos[:, s:], kv, s)
    torch.testing.assert_close(prefix, full[:, s:], atol=1e-5, rtol=1e-5)
    dual = model(x[:, s:e], pos[:, s:e], kv, s)
    torch.testing.assert_close(dual, full[:, s:e], atol=1e-5, rtol=1e-5)


def test_dual_window_matches_reference_replace_position(llada_dir):
    """After the block changes, the dual-cache window equals Fast-dLLM's in-place replace path."""
    model, _ = load_model(llada_dir)
    ref = RefModel(llada_dir)
    x = torch.randint(0, 50, (1, 24))
    pos = torch.arange(24)[None]
    kv = StaticKV(model.config.num_layers, 24)
    model(x, pos, kv, 0)
    _, past = ref(x)
    y = x.clone()
    y[:, 10:16] = torch.randint(0, 50, (1, 6))
    replace = torch.zeros_like(y, dtype=torch.bool)
    replace[:, 10:16] = True
    ours = model(y[:, 10:16], pos[:, 10:16], kv, 10)
    theirs = ref(y[:, 10:16], past_key_values=past, replace_position=replace)[0]
    torch.testing.assert_close(ours, theirs, atol=1e-5, rtol=1e-5)
