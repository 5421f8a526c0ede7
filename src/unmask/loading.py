"""Loading helpers of the front end: the embedded models' folders, the device, the checkpoint's
special ids checked against its vocabulary."""

from pathlib import Path

import torch

from unmask.errors import CheckpointError, UnmaskError
from unmask.hub import download, is_hub_name
from unmask.models.base import TokenIds

ASSETS = Path(__file__).parent / "assets"
# the models the package ships (trained by this project, 4 layers, d_model 256, the task-suite
# vocabulary): name -> what it is, one line (`unmask models`, --model's help)
EMBEDDED_ABOUT = {
    "default": "masked diffusion (LLaDA layout), full attention; the CLI's model when --model is not given",
    "default-ar": "its autoregressive twin (same data, size and tokenizer): the AR baseline",
    "default-block": "block diffusion (blocks of 8, exact KV cache of finished blocks)",
    "default-edit": "default-block trained to edit committed tokens (--edit-threshold, docs/editing.md)",
    "default-renoise": "a renoising model in DiffusionGemma's layout (docs/diffusion-gemma.md)",
    "default-dflash": "DFlash drafter for default-ar (--draft default-dflash, docs/speculative.md)",
    "default-code": "masked diffusion on Python (CPython's standard library, byte-level BPE): infilling, "
                    "docs/infilling.md",
    "default-code-ar": "its autoregressive twin, trained prefix-suffix-middle (infills through --suffix)",
}
EMBEDDED = {name: ASSETS / name for name in EMBEDDED_ABOUT}
_NAMES = ", ".join(repr(n) for n in EMBEDDED_ABOUT)


def resolve_model_path(model: str | Path | None) -> Path:
    """The folder of `model`: an embedded model's name, a local folder, or a Hub name (`org/name`,
    `org/name@revision`: unmask.hub, downloaded into the Hub cache) — in that order, so an embedded
    name or an existing local folder shadows a Hub name."""
    if model is not None and not isinstance(model, (str, Path)):
        raise UnmaskError(f"model {model!r} must be a folder path, a Hub name (org/name) or an embedded model's name: {_NAMES}")
    name = "default" if model is None else str(model)
    if isinstance(model, str) and not model.strip():
        raise UnmaskError(f"model {model!r} is empty; give a checkpoint folder or an embedded model's name: {_NAMES}")
    if name in EMBEDDED:
        path = EMBEDDED[name]
        if not (path / "config.json").exists():
            raise UnmaskError(f"the embedded model {name!r} is not in this installation ({path})")
        return path
    path = Path(model)
    if isinstance(model, str) and not path.exists() and is_hub_name(model):  # a local folder wins
        return download(model)
    return path


def check_device(device) -> torch.device:
    """A torch device that exists here, or an UnmaskError naming it."""
    if not isinstance(device, (str, torch.device)):
        raise UnmaskError(f"device {device!r} must be a name such as cpu or cuda")
    try:
        d = torch.device(device)
    except (RuntimeError, ValueError):
        raise UnmaskError(f"unknown device {device!r}; use cpu, cuda or cuda:N") from None
    if d.type == "cuda":
        if not torch.cuda.is_available():
            raise UnmaskError(f"device {device!r}: CUDA is not available on this machine")
        if d.index is not None and d.index >= torch.cuda.device_count():
            raise UnmaskError(f"device {device!r}: this machine has {torch.cuda.device_count()} CUDA device(s)")
    elif d.type == "mps" and not torch.backends.mps.is_available():
        raise UnmaskError(f"device {device!r}: MPS is not available on this machine")
    elif d.type not in ("cpu", "cuda", "mps"):
        raise UnmaskError(f"device {device!r} is not supported; use cpu or cuda")
    return d


def check_token_ids(t: TokenIds, vocab: int, path) -> None:
    """Every special id the checkpoint names lies inside the model's vocabulary."""
    for name, value in (("mask", t.mask), ("eos", t.eos), ("pad", t.pad), ("bos", t.bos)):
        if value is not None and not 0 <= value < vocab:
            raise CheckpointError(f"{path}: {name} token id {value} is outside the model's vocabulary [0, {vocab})")
    bad = [i for i in t.stop if not 0 <= i < vocab]
    if bad:
        raise CheckpointError(f"{path}: stop token id {bad[0]} is outside the model's vocabulary [0, {vocab})")
    if t.mask is not None and (t.mask in t.stop or t.mask == t.pad):
        raise CheckpointError(f"{path}: the mask token id {t.mask} is also an end-of-text or padding id")


def default_device() -> str:
    return "cuda" if torch.cuda.is_available() else "cpu"
