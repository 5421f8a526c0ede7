"""`--compat fast-dllm-v2` against what Fast-dLLM v2's own code returned.

tests/data/fast-dllm-v2-upstream/ (a copy of shared/data/fast-dllm-v2-upstream/) holds a tiny random
checkpoint in the released Fast_dLLM_v2_7B layout and 40 batches run through the unmodified upstream
loop (`v2/generation_functions.py` `batch_sample`, NVlabs/Fast-dLLM 6cf2722, on the published HF
model code, transformers 4.53.1, CPU, float32), called as `v2/eval.py` calls it. Every case must
match exactly: each row's ids after its prompt (generated tokens, the padding after a stop, the
trailing token of the last seal forward) and the forwards each row took part in. Nothing here
was written by this project except the comparison.
"""

import json
from pathlib import Path

import pytest

from unmask import LLM, GenerationParams

DATA = Path(__file__).parent / "data" / "fast-dllm-v2-upstream"
CASES = json.loads((DATA / "cases.json").read_text())["cases"]


@pytest.fixture(scope="module")
def upstream_llm():
    return LLM(DATA / "tiny")


def test_the_released_layout_resolves_the_tokenizers_pad_not_config_json(upstream_llm):
    """config.json says pad_token_id = the stop token (as the release does); upstream pads finished
    rows with tokenizer.pad_token_id (<|endoftext|>)."""
    special = json.loads((DATA / "cases.json").read_text())["special_ids"]
    config = json.loads((DATA / "tiny" / "config.json").read_text())
    assert config["pad_token_id"] == special["stop"]  # the release's quirk, kept in the fixture
    ids = upstream_llm.token_ids
    assert (ids.mask, ids.eos, ids.pad) == (special["mask"], special["stop"], special["tokenizer_pad"])


@pytest.mark.parametrize("case", range(len(CASES)))
def test_compat_fast_dllm_v2_returns_what_upstream_returned(upstream_llm, case):
    c = CASES[case]
    out = upstream_llm.generate(c["prompts"], GenerationParams(
        compat="fast-dllm-v2", gen_length=c["max_new_tokens"], block_length=c["small_block_size"],
        threshold=c["threshold"], cache="exact-dual" if c["use_block_cache"] else "exact"))
    assert c["block_size"] == upstream_llm.arch.block_size
    assert [r.raw_ids for r in out.results] == c["upstream_gen_ids"]
    assert [r.nfe for r in out.results] == c["upstream_forwards_per_row"]
    assert out.nfe == c["upstream_forward_calls"]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_the_reference_port_returns_what_upstream_returned(case):
    """tests/reference.py's port (an independent forward, no unmask code) agrees with upstream too,
    so the port-based tests in test_block.py test against the real behaviour."""
    import torch
    from reference import QwenBlockRef, fast_dllm_v2_batch_sample

    c, special = CASES[case], json.loads((DATA / "cases.json").read_text())["special_ids"]
    lens = [len(p) for p in c["prompts"]]
    inp = torch.full((len(lens), max(lens)), special["mask"])
    for r, p in enumerate(c["prompts"]):
        inp[r, : len(p)] = torch.tensor(p)
    with torch.no_grad():
        rows, nfe = fast_dllm_v2_batch_sample(QwenBlockRef(DATA / "tiny"), inp, torch.tensor(lens), c["block_size"],
                                              c["max_new_tokens"], c["small_block_size"], special["mask"],
                                              c["threshold"], special["stop"], special["tokenizer_pad"],
                                              c["use_block_cache"])
    assert [row[n:] for row, n in zip(rows, lens)] == c["upstream_gen_ids"]
    assert nfe == c["upstream_forwards_per_row"]
