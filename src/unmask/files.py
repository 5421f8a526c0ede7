"""Writing results safely: a folder checked for writing before work starts, and JSON replaced
atomically so that a reader never sees half a file."""

import json
from pathlib import Path

from unmask.errors import UnmaskError


def writable_folder(folder: str | Path, what: str = "folder") -> Path:
    """Create `folder` (and parents) and check that a file can be written there, or raise an
    UnmaskError naming it and the reason."""
    folder = Path(folder)
    try:
        folder.mkdir(parents=True, exist_ok=True)
        probe = folder / ".write-test"
        probe.write_text("")
        probe.unlink()
    except OSError as e:
        raise UnmaskError(f"cannot write the {what} {folder}: {e.strerror or e}") from None
    return folder


def write_json_atomic(path: str | Path, obj) -> None:
    path = Path(path)
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(json.dumps(obj, indent=2))
    tmp.replace(path)
