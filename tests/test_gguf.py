"""GGUF files written by llama.cpp's own converter (tests/data/gguf-upstream, recorded by its
record.py from the tiny LLaDA, Dream and LLaDA-MoE checkpoints of tests/checkpoints.py): read through the
`gguf` package, they are their safetensors source — F32 weight for weight and token for token,
F16 / BF16 / Q8_0 as the format rounds them — and what unmask cannot run is refused by name."""

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from unmask import LLM
from unmask.errors import CheckpointError
from unmask.models.gguf import GGUFFile, is_gguf
from checkpoints import write_dream, write_llada, write_llada_moe

DATA = Path(__file__).parent / "data" / "gguf-upstream"
WRITE = {"llada": lambda p: write_llada(p, bpe=True, shards=1), "dream": lambda p: write_dream(p, bpe=True, shards=1),
         # LLaDA-MoE as llama.cpp runs it (src/models/llada-moe.cpp): every layer routed, no shared
         # expert, no expert bias (record.py writes the same)
         "llada-moe": lambda p: write_llada_moe(p, bpe=True, shards=1, shared_ff=0, expert_bias=False,
                                                moe_layer_freq=(1, 1, 1))}
TEXTS = ["the cat sat on the mat", "def f(x):\n    return x + 1\n", "3 + 4 = 7, 12 * 12 = 144 ünïcode"]


@pytest.fixture(scope="module", params=["llada", "dream", "llada-moe"])
def pair(request, tmp_path_factory):
    """(the safetensors source, the same model from llama.cpp's F32 GGUF of it)."""
    src = WRITE[request.param](tmp_path_factory.mktemp(request.param))
    return request.param, LLM(src), LLM(DATA / f"{request.param}-f32.gguf")


def test_f32_gguf_is_its_source_weight_for_weight_and_token_for_token(pair):
    name, src, gg = pair
    assert gg.arch == src.arch and gg.token_ids == src.token_ids
    a, b = src.model.state_dict(), gg.model.state_dict()
    # q/k unpermuted, names mapped, stacked experts read back one by one
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)
    for text in TEXTS:
        assert gg.tokenizer.encode(text, add_special_tokens=False) == src.tokenizer.encode(text, add_special_tokens=False)
        ids = src.tokenizer.encode(text, add_special_tokens=False)
        assert gg.tokenizer.decode(ids) == src.tokenizer.decode(ids)
    assert gg.tokenizer.chat_template == src.tokenizer.chat_template
    ids = [src.tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]
    for params in (src.default_params(gen_length=16), src.default_params(gen_length=16, block_length=8, steps=16,
                                                                          policy="fixed", cache="none")):
        assert [r.raw_ids for r in gg.generate(ids, params).results] == \
            [r.raw_ids for r in src.generate(ids, params).results]


def test_the_prompt_gets_the_bos_the_file_asks_for():
    """LLaDA's converter writes add_bos_token: llama.cpp begins every prompt with BOS, and so does
    the tokenizer rebuilt from the file."""
    gg = GGUFFile(DATA / "llada-f32.gguf")
    tok, cfg, _ = gg.tokenizer()
    bos = int(gg.meta["tokenizer.ggml.bos_token_id"])
    assert gg.meta["tokenizer.ggml.add_bos_token"] and tok.encode("the cat").ids[0] == bos
    assert cfg["bos_token"] == gg.meta["tokenizer.ggml.tokens"][bos]


@pytest.mark.parametrize("kind", ["f16", "bf16", "q8_0"])
def test_smaller_types_are_the_source_as_the_format_rounds_it(pair, kind):
    name, src, _ = pair
    gg = LLM(DATA / f"{name}-{kind}.gguf")
    a, b = src.model.state_dict(), gg.model.state_dict()
    cast = {"f16": torch.float16, "bf16": torch.bfloat16}.get(kind)
    stored = GGUFFile(DATA / f"{name}-{kind}.gguf")
    types = {k: stored.tensors[g.split("#")[0]].tensor_type.name for k, g in stored.names(list(a), 3).items()}
    for k in a:
        if types[k] == "F32":  # norms, biases (and a router) the converter keeps in F32 in every file
            assert a[k].dim() == 1 or "mlp.gate." in k, k
            assert torch.equal(a[k], b[k]), k
        elif cast is not None:
            assert torch.equal(a[k].to(cast).float(), b[k]), k
        else:  # Q8_0: blocks of 32 along a row, int8 codes and one scale (amax / 127) each
            blocks = a[k].reshape(-1, 32)
            step = blocks.abs().amax(1, keepdim=True) / 127
            # (the scale itself is stored as float16: up to 127 codes times its rounding more)
            assert ((blocks - b[k].reshape(-1, 32)).abs() <= 0.57 * step + 1e-7).all(), k
    x = torch.tensor([src.tokenizer.encode(" ".join(TEXTS), add_special_tokens=False)])
    pos = torch.arange(x.shape[1])[None]
    with torch.no_grad():
        la, lb = src.model(x, pos), gg.model(x, pos)
    rel = ((la - lb).norm() / la.norm()).item()
    agree = (la.argmax(-1) == lb.argmax(-1)).float().mean().item()
    # logits' relative error on these tiny random models (measured: f16 < 1e-3, bf16 ~1.6e-2,
    # q8_0 ~4e-2; argmax agreement 0.85-0.95); LLaDA-MoE's more (a token near a routing tie takes
    # other experts: f16 8e-3, bf16 2.9e-2, q8_0 5.0e-2; agreement 0.95-1.0)
    bound = {"f16": 2e-3, "bf16": 3e-2, "q8_0": 8e-2} if name != "llada-moe" else {"f16": 2e-2, "bf16": 6e-2, "q8_0": 1e-1}
    assert rel < bound[kind] and agree >= 0.8, (kind, rel, agree)


def test_a_gguf_runs_in_int8_and_from_the_cli(tmp_path, capsys):
    from unmask.cli import main

    assert LLM.check_args(DATA / "dream-q8_0.gguf") == DATA / "dream-q8_0.gguf"  # what Ray replicas check first

    gg = LLM(DATA / "llada-f32.gguf", quantize="int8")
    assert gg.generate(["the cat"], gg.default_params(gen_length=8), chat=False).results[0].nfe >= 1
    for q in ("int8", "int4"):  # LLaDA-MoE's stacked experts, read expert by expert, go to int8 banks
        moe = LLM(DATA / "llada-moe-q8_0.gguf", quantize=q)
        assert len(moe.generate([[5, 6, 7]], moe.default_params(gen_length=8)).results[0].raw_ids) == 8
    assert main(["generate", "--model", str(DATA / "llada-f32.gguf"), "--gen-length", "8", "--json", "the cat"]) == 0
    assert "text" in json.loads(capsys.readouterr().out.strip().splitlines()[-1])


@pytest.fixture(scope="module")
def wide(tmp_path_factory):
    """The 256-wide LLaDA that llama-quantize's files (llada256-*.gguf) were made from."""
    return LLM(write_llada(tmp_path_factory.mktemp("wide"), d=256, layers=1, heads=4, kv_heads=2, ff=256, bpe=True,
                           shards=1))


# each type's relative error per weight matrix on these Gaussian weights (measured: Q4_0 0.086,
# Q4_K 0.072, Q5_K 0.036, Q6_K 0.018; the bound a little above)
ROUNDING = {"Q4_0": 0.095, "Q4_K": 0.08, "Q5_K": 0.04, "Q6_K": 0.02}


@pytest.mark.parametrize("kind", ["q4_0", "q4_k_m", "q5_k_m"])
def test_llama_quantize_files_are_their_source_as_each_type_rounds_it(wide, kind):
    """Files llama-quantize wrote (Q4_0; Q4_K_M = Q4_K and Q6_K tensors; Q5_K_M = Q5_K and Q6_K)
    load, each weight its source within its type's rounding, and decode."""
    f = GGUFFile(DATA / f"llada256-{kind}.gguf")
    gg = LLM(f.path)
    a, b = wide.model.state_dict(), gg.model.state_dict()
    seen = set()
    for k, name in f.names(list(a), 1).items():
        t = f.tensors[name].tensor_type.name
        if a[k].dim() == 2:
            seen.add(t)
            assert ((a[k] - b[k]).norm() / a[k].norm()).item() < ROUNDING[t], (k, t)
        else:
            assert torch.equal(a[k], b[k]), k  # norms stay F32
    assert seen == {"q4_0": {"Q4_0", "Q6_K"}, "q4_k_m": {"Q4_K", "Q6_K"}, "q5_k_m": {"Q5_K", "Q6_K"}}[kind]
    out = gg.generate(["the cat"], gg.default_params(gen_length=8), chat=False).results[0]
    assert len(out.raw_ids) == 8


def test_q4_0_stays_in_four_bits_with_int4(wide):
    """With quantize="int4" a Q4_0 tensor keeps its nibbles (no second rounding to 4 bits; q/k rows
    unpermuted as the float load unpermutes them) and its scales as the kernel's codes: each int4
    layer multiplies by the weight the float load dequantizes, within one int8 step of its row."""
    from unmask.layers.int4 import Int4Linear, quantize_groups

    plain, packed = LLM(DATA / "llada256-q4_0.gguf"), LLM(DATA / "llada256-q4_0.gguf", quantize="int4")
    layers = {n: m for n, m in packed.model.named_modules() if isinstance(m, Int4Linear)}
    assert len(layers) == 7  # q, k, v, o, gate, up, down; the head (Q6_K) stays float
    weights = plain.model.state_dict()
    for n, m in layers.items():
        w = weights[f"{n}.weight"]
        nibbles = quantize_groups(w)[0]  # the file's nibbles: re-rounding a Q4_0 weight gives them back
        g = m.packed[: m.out_features].view(m.out_features, -1, 16)
        assert torch.equal(torch.cat([g & 15, g >> 4], -1).reshape(w.shape), nibbles), n
        assert ((m.dequantized() - w).abs() <= m.r[: m.out_features, None] * (1 + 1e-5)).all(), n
    ids = [wide.tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]
    assert [len(r.raw_ids) for r in packed.generate(ids, packed.default_params(gen_length=8)).results] == [8] * 3


def test_q4_k_stays_in_four_bits_with_int4(wide):
    """With quantize="int4" a Q4_K tensor (llama.cpp's k-quant: unsigned nibbles, a scale and a
    minimum per group of 32) keeps its nibbles as stored and its minimums as per-group offsets:
    the layout read back is llama.cpp's own dequantization, and each int4 layer multiplies by the
    weight the float load dequantizes, within one int8 step of its row (the scales' codes) and one
    of its offsets (held in int8); a row's output does not depend on the rest of the batch."""
    import gguf

    from unmask.layers.int4 import GROUP, Int4Linear, dequantize, from_q4_k_blocks

    f = GGUFFile(DATA / "llada256-q4_k_m.gguf")
    q4k = {n: t for n, t in f.tensors.items() if t.tensor_type.name == "Q4_K"}
    assert q4k
    for t in q4k.values():
        rows, cols = (int(x) for x in reversed(t.shape.tolist()))
        q, scale, offset = from_q4_k_blocks(np.asarray(t.data), rows, cols)
        ref = torch.from_numpy(gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)).reshape(rows, cols)
        mine = (dequantize(q, scale).view(rows, -1, GROUP) + offset[..., None]).reshape(rows, cols)
        assert torch.allclose(mine, ref, rtol=0, atol=1e-6 * ref.abs().max().item()), t.name
    plain, packed = LLM(f.path), LLM(f.path, quantize="int4")
    names = {v: k for k, v in f.names(list(plain.model.state_dict()), 1).items()}
    weights = plain.model.state_dict()
    kept = 0
    for name in q4k:
        layer = names[name].removesuffix(".weight")
        m = packed.model.get_submodule(layer)
        if isinstance(plain.model.get_submodule(layer), torch.nn.Embedding):  # the token embedding: int8
            continue
        assert isinstance(m, Int4Linear) and m.offset_codes is not None, layer
        w = weights[names[name]]
        # one int8 step of the row (the scales' codes) and one of the offsets' int8 rows
        step = (m.r + m.offset_scale)[: m.out_features, None]
        assert ((m.dequantized() - w).abs() <= step * (1 + 1e-5) + 1e-6).all(), layer
        x = torch.randn(5, w.shape[1])
        ref = x @ m.dequantized().T  # the kernel's int8 activations cost ~0.7 % (without the offsets: ~40 %)
        y = m(x)
        assert ((y - ref).norm() / ref.norm()).item() < 0.02, layer
        assert all(torch.equal(m(x[i : i + 1]), y[i : i + 1]) for i in range(5)), layer
        kept += 1
    assert kept == 5  # q, k, o, gate, up (v and down are Q6_K in a Q4_K_M file)
    ids = [wide.tokenizer.encode(t, add_special_tokens=False) for t in TEXTS]
    assert [len(r.raw_ids) for r in packed.generate(ids, packed.default_params(gen_length=8)).results] == [8] * 3


def _write(path: Path, arch: str, tensors: dict, meta: dict | None = None) -> Path:
    import gguf

    w = gguf.GGUFWriter(str(path), arch)
    for k, v in (meta or {}).items():
        w.add_uint32(k, v)
    for k, v in tensors.items():
        w.add_tensor(k, v)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    return path


def test_what_unmask_cannot_run_is_refused_by_name(tmp_path):
    with pytest.raises(CheckpointError, match="GGUF architecture 'llama' is not one unmask runs; it reads llada, dream"):
        LLM(_write(tmp_path / "llama.gguf", "llama", {"token_embd.weight": np.zeros((4, 32), np.float32)}))
    # the converter's LLaDA file with one tensor more than the model has a place for
    src = GGUFFile(DATA / "llada-f32.gguf")
    extra = tmp_path / "extra.gguf"
    import gguf

    w = gguf.GGUFWriter(str(extra), "llada")
    for k, f in src.reader.fields.items():
        if k.startswith("GGUF.") or k == "general.architecture":
            continue
        w.add_key_value(k, f.contents(), f.types[0], sub_type=f.types[-1] if len(f.types) > 1 else None)
    for t in src.reader.tensors:
        w.add_tensor(t.name, np.array(t.data), raw_shape=None)
    w.add_tensor("blk.0.attn_sinks.weight", np.zeros(4, np.float32))
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()
    with pytest.raises(CheckpointError, match="tensors unmask's llada model has no place for: blk.0.attn_sinks"):
        LLM(extra)
    not_gguf = tmp_path / "model.gguf"
    not_gguf.write_bytes(b"GGML" + bytes(60))
    assert not is_gguf(not_gguf)
    with pytest.raises(CheckpointError, match="is a file"):
        LLM(not_gguf)


def test_a_tensor_read_again_after_its_pages_are_released_is_the_same():
    """Reading drops a tensor's mapped pages once copied out (they stay in the page cache); a
    second read of it, or of its neighbours, gives the same values."""
    f = GGUFFile(DATA / "llada-q8_0.gguf")
    names = list(f.tensors)[:3]
    first = [f.read(n, n, f.config()) for n in names]
    again = [f.read(n, n, f.config()) for n in names]
    assert all(torch.equal(a, b) for a, b in zip(first, again))


def test_one_forward_decodes_what_llama_cpps_diffusion_cli_decodes():
    """llama.cpp's own `llama-diffusion-cli` on the converter's LLaDA and LLaDA-MoE files
    (diffusion-cli.json, recorded by record.py): a block committed by one forward's argmax is the
    same text from unmask (LLaDA-MoE's routing, its q/k norms and rotary layout as llama.cpp runs
    them; the prompt's template and BOS as llama.cpp lays them out)."""
    cases = json.loads((DATA / "diffusion-cli.json").read_text())
    assert {c["file"] for c in cases} == {"llada-f32.gguf", "llada-moe-f32.gguf"}
    for c in cases:
        llm = LLM(DATA / c["file"])
        assert len(llm.encode(c["prompt"])[0]) == c["prompt_ids"]
        out = llm.generate([c["prompt"]], llm.default_params(compat="llada", gen_length=c["block"],
                                                             block_length=c["block"], steps=1))
        text = llm.tokenizer.decode(out.results[0].raw_ids, skip_special_tokens=False)
        assert text.strip() == c["text"].strip(), (c["file"], c["prompt"])
