"""Paths a command reads and writes: each checked before any work starts, with an error that names
the flag, the path and what is wrong with it (a folder where a file is expected or the reverse, a
path inside a file, a folder that cannot be written), and results written atomically so that a
reader never sees half a file and a failed write leaves nothing behind."""

import json
import os
import tempfile
from collections.abc import Callable
from pathlib import Path

from unmask.errors import UnmaskError


def _label(flag: str, path: Path) -> str:
    return f"{flag} {path}" if flag else str(path)


def _blocked(path: Path) -> str | None:
    """Why `path` cannot be created: an ancestor that is a file, or a nearest existing folder in
    which nothing can be created (tried: a temporary folder is made and removed, which also catches
    what permission bits do not, such as a read-only or virtual file system). None when it can be."""
    for parent in path.parents:
        if parent.exists() or parent.is_symlink():
            if not parent.is_dir():
                return f"{parent} is a file, so nothing can be created inside it"
            try:
                os.rmdir(tempfile.mkdtemp(prefix=".unmask-probe-", dir=parent))
            except OSError as e:
                return f"nothing can be created in the folder {parent} ({e.strerror or e})"
            return None
    return None


def file_inside_file(path: Path) -> Path | None:
    """The ancestor of `path` that is a file, if any (then `path` can never exist)."""
    return next((p for p in path.parents if p.exists() and not p.is_dir()), None)


def _path(path: str | Path, flag: str) -> Path:
    if isinstance(path, str) and not path.strip():
        raise UnmaskError(f"{flag or 'path'} {path!r} is empty; give a path")
    return Path(path)


def input_folder(path: str | Path, flag: str = "", what: str = "folder") -> Path:
    """An existing folder to read from."""
    path = _path(path, flag)
    if path.is_dir():
        return path
    if path.exists():
        raise UnmaskError(f"{_label(flag, path)} is a file; it must be a {what}")
    blocker = file_inside_file(path)
    if blocker is not None:
        raise UnmaskError(f"{_label(flag, path)} does not exist ({blocker} is a file); it must be a {what}")
    raise UnmaskError(f"{_label(flag, path)} does not exist; it must be a {what}")


def output_file(path: str | Path, flag: str = "", beside: tuple[str | Path, ...] = (), suffix: str = ".json") -> Path:
    """Check, leaving nothing behind, that `path` (and the files in `beside`, written next to it)
    can be written as files: none of them is a folder, no ancestor is a file, something can be
    created in the nearest existing folder, and an existing file there can be replaced. `suffix`
    names the kind of file in the error's example."""
    path = _path(path, flag)
    for p in (path, *map(Path, beside)):
        if p.is_dir():
            raise UnmaskError(f"{_label(flag, path)}: {p} is a folder; give a file path (for example "
                              f"{p / ('out' + suffix)})")
        why = _blocked(p)
        if why:
            raise UnmaskError(f"{_label(flag, path)} cannot be written: {why}")
        if p.exists() and not os.access(p, os.W_OK):
            raise UnmaskError(f"{_label(flag, path)} cannot be written: {p} is read-only")
    return path


def output_folder(path: str | Path, flag: str = "") -> Path:
    """Check, leaving nothing behind, that `path` is a folder or can be made one, and written into."""
    path = _path(path, flag)
    if path.exists() and not path.is_dir():
        raise UnmaskError(f"{_label(flag, path)} is a file; it must be a folder")
    why = _blocked(path / "probe") if path.is_dir() else _blocked(path)
    if why:
        raise UnmaskError(f"{_label(flag, path)} cannot be written: {why}")
    return path


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


def write_atomic(path: str | Path, write: Callable[[Path], None]) -> None:
    """`write(tmp)` writes a temporary file beside `path` (same suffix, so formats that follow the
    name still do), which then replaces `path`; on any failure the temporary file is removed and
    `path` is left as it was."""
    path = Path(path)
    tmp = path.with_name(f".{path.stem}.tmp-{os.getpid()}{path.suffix}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        write(tmp)
        os.replace(tmp, path)
    except OSError as e:
        tmp.unlink(missing_ok=True)
        raise UnmaskError(f"cannot write {path}: {e.strerror or e}") from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise


def write_json_atomic(path: str | Path, obj) -> None:
    write_atomic(path, lambda tmp: tmp.write_text(json.dumps(obj, indent=2)))


def save_figure(fig, path: str | Path, **kw) -> None:
    """A matplotlib figure saved atomically, in the format its name's suffix says (png without one)."""
    path = Path(path)
    fmt = path.suffix[1:].lower() or "png"
    write_atomic(path, lambda tmp: fig.savefig(tmp, format=fmt, **kw))


def check_figure_path(path: str | Path, flag: str = "") -> Path:
    """An output path for a plot: writable (see output_file) in a format matplotlib can write."""
    from matplotlib.backend_bases import FigureCanvasBase

    path = output_file(path, flag, suffix=".png")
    fmt = path.suffix[1:].lower() or "png"
    formats = FigureCanvasBase.get_supported_filetypes()
    if fmt not in formats:
        raise UnmaskError(f"{_label(flag, path)}: a plot cannot be written as {fmt!r}; use a name ending in "
                          + ", ".join("." + f for f in sorted(formats)))
    return path
