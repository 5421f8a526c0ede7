"""Writing a trained model as a checkpoint folder in the released layout (every kind of training
writes through this; the trainer and the drafter / renoising recipes import it, not each other)."""

import json
from pathlib import Path

from safetensors.torch import save_file

from unmask.train.data import save_tokenizer_files


def write_checkpoint(folder: Path, model, config: dict, generation: dict | None, meta: dict, tok) -> None:
    """A checkpoint folder: the model's state dict (its names are the release's), config.json,
    generation_config.json (unless None: a drafter has none), training.json and the tokenizer
    files, written atomically (a temp folder, then a rename)."""
    folder = Path(folder)
    tmp = folder.with_name(folder.name + ".tmp")
    tmp.mkdir(parents=True, exist_ok=True)
    state = {k: v.detach().contiguous().float() for k, v in model.state_dict().items()}
    save_file(state, str(tmp / "model.safetensors"), metadata={"format": "pt"})
    (tmp / "config.json").write_text(json.dumps(config, indent=2))
    if generation is not None:
        (tmp / "generation_config.json").write_text(json.dumps(generation, indent=2))
    (tmp / "training.json").write_text(json.dumps(meta, indent=2))
    save_tokenizer_files(tok, tmp)
    if folder.exists():
        for f in folder.iterdir():
            f.unlink()
        folder.rmdir()
    tmp.rename(folder)
