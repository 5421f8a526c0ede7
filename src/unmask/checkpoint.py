"""Opening a checkpoint for the front end: what `LLM(...)` holds once loaded — the model, its
recommended decoding settings (generation_config.json), its tokenizer, its special ids, and a
DFlash drafter when one is given — and the checks of the loading arguments that run before
anything is loaded (`check_args`: also for processes that load elsewhere, Ray replicas)."""

from dataclasses import dataclass, replace
from pathlib import Path

import torch

from unmask.engine.kind import ROW_KINDS, kind_for
from unmask.errors import CheckpointError, UnmaskError
from unmask.loading import check_device, check_token_ids, resolve_model_path
from unmask.models.base import TokenIds
from unmask.models.gguf import GGUFFile, is_gguf
from unmask.models.loader import (DTYPES, check_linear_kernel, check_quantize, check_split, load_model,
                                  read_json, resolve_dtype)
from unmask.models.registry import resolve_family
from unmask.parallel import check_world
from unmask.tokenizer import Tokenizer, resolve_token_ids


def one_process_draft(world: int) -> None:
    """Speculative decoding runs in one process: a drafter with tensor parallelism is refused."""
    if world > 1:
        raise UnmaskError("draft: speculative decoding runs in one process; it does not combine with "
                          f"tensor_parallel {world}", param="draft")


def check_args(model=None, dtype: str | None = None, device: str = "cpu", tensor_parallel: int = 1,
               draft=None, quantize: str | None = None, linear_kernel: str | None = None) -> Path:
    """What LLM(...) with these arguments checks before it loads anything, without loading; the
    device is checked by name only, since it may be another machine's. Returns the model folder."""
    path = resolve_model_path(model)
    if is_gguf(path):  # a GGUF file: its settings as the release's config (unmask.models.gguf)
        cfg = GGUFFile(path).config()
    elif not path.is_dir():
        raise UnmaskError(f"model folder {path} does not exist", param="model")
    else:
        cfg = read_json(path / "config.json")
    resolve_family(cfg)
    check_linear_kernel(linear_kernel)
    world = check_world(tensor_parallel)
    if draft is not None:
        draft_path = resolve_model_path(draft)
        if not (draft_path / "config.json").is_file():
            raise UnmaskError(f"draft folder {draft_path} has no config.json", param="draft")
        one_process_draft(world)
    if dtype is not None and dtype != "auto" and dtype not in DTYPES:
        raise UnmaskError(f"unknown dtype {dtype!r}; choose one of auto, {', '.join(DTYPES)}", param="dtype")
    if not isinstance(device, str) or device.split(":")[0] not in ("cpu", "cuda", "mps"):
        raise UnmaskError(f"device {device!r} is not supported; use cpu or cuda", param="device")
    if quantize is not None:
        torch_device = "cpu" if device.startswith("cpu") else None
        if torch_device is not None:  # a GPU's quantization is checked where the GPU is
            check_quantize(quantize, torch_device, resolve_dtype(dtype, check_device("cpu")))
        elif quantize not in ("int8", "fp8"):
            raise UnmaskError(f"quantize {quantize!r} on {device}: choose int8 or fp8 (int4 runs on CPU)",
                              param="quantize")
    if world > 1:
        check_split(path, world)
    return path


@dataclass
class Opened:
    """A loaded checkpoint: the model (its `config` the architecture), the checkpoint's config
    and generation_config.json, tokenizer, special ids, and the drafter (or None)."""

    model: torch.nn.Module
    config: dict
    generation_config: dict
    tokenizer: Tokenizer
    token_ids: TokenIds
    drafter: object = None


def open_checkpoint(path: Path, dtype: str | None, device, tp=None, quantize: str | None = None,
                    linear_kernel: str | None = None, draft_path: Path | None = None) -> Opened:
    """Load the checkpoint at `path` (a folder or a GGUF file) on `device` (`tp`: this rank's
    tensor-parallel group), and its drafter from `draft_path`."""
    model, config = load_model(path, dtype=dtype, device=device, tp=tp, quantize=quantize, linear_kernel=linear_kernel)
    arch = model.config
    gen_path = path / "generation_config.json"
    generation_config = read_json(gen_path) if gen_path.exists() else {}
    if not isinstance(generation_config, dict):
        raise CheckpointError(f"{gen_path} must hold a JSON object")
    family = resolve_family(config)
    if is_gguf(path):  # the tokenizer the file holds (unmask.models.gguf)
        tokenizer = Tokenizer(*GGUFFile(path).tokenizer())
    else:
        tokenizer = Tokenizer.from_dir(_tokenizer_dir(path, family))
    if arch.family == "a2d":  # rendered as dllm renders it
        from unmask.models.a2d import TEMPLATE_VARS

        tokenizer.template_vars = dict(TEMPLATE_VARS)
    drafter = None
    if draft_path is not None:
        from unmask.models.dflash import check_pair
        from unmask.models.loader import load_drafter

        drafter, _ = load_drafter(draft_path, dtype=dtype, device=device, linear_kernel=linear_kernel)
        check_pair(drafter.config, arch, str(draft_path))
    implied = family.token_defaults(config) if family.token_defaults is not None else {}
    holds = ROW_KINDS.lookup(kind_for(arch, drafter), UnmaskError).mask_token(arch)  # what unwritten positions hold
    token_ids = resolve_token_ids({**implied, **config}, generation_config, tokenizer, needs_mask=holds == "model")
    if token_ids.mask is None and holds == "placeholder":  # an id the model never writes: the drafter's mask
        mask = drafter.config.mask_token_id if drafter is not None else None  # token, else a spare id
        token_ids = replace(token_ids, mask=mask if mask is not None else _spare_id(tokenizer, arch.vocab_size, path))
    check_token_ids(token_ids, arch.vocab_size, path)
    return Opened(model, config, generation_config, tokenizer, token_ids, drafter)


def _tokenizer_dir(path: Path, family) -> Path:
    """The model folder, or for a release that ships no tokenizer files (MDLM / BD3-LM) the
    tokenizer it was trained with, through the Hub cache (unmask.hub.download_tokenizer)."""
    has = (path / "tokenizer.json").exists() or (path / "vocab.json").exists()
    if has or family.tokenizer_from is None:
        return path
    from unmask.hub import download_tokenizer

    return download_tokenizer(family.tokenizer_from, str(path))


def _spare_id(tokenizer: Tokenizer, vocab_size: int, path) -> int:
    """An id of the embedding that no token of the tokenizer has (Qwen's padding rows): the
    placeholder of an autoregressive model's not-yet-written positions, which the proposal never
    picks. A model whose tokenizer fills its whole vocabulary is refused by name."""
    spare = max(tokenizer.tok.get_vocab(with_added_tokens=True).values(), default=-1) + 1
    if spare >= vocab_size:
        raise CheckpointError(f"{path}: no mask token, and the tokenizer uses every id of the model's "
                              f"vocabulary of {vocab_size}: unmask needs one id the model never writes")
    return spare
