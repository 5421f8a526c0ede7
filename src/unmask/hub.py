"""Models named by their Hugging Face Hub names: `org/name` or `org/name@revision`, resolved to a
folder in the Hub cache through `huggingface_hub` (its cache and environment: HF_HOME /
HF_HUB_CACHE, HF_TOKEN, HF_HUB_OFFLINE, HF_ENDPOINT for mirrors). A repository of GGUF files is
named as llama.cpp's `-hf` names it, `org/name:TAG` (`:Q8_0`, `:F16`): the one .gguf file whose
name holds the tag, case aside (unmask.models.gguf reads it); without a tag, its only .gguf file.

Only what the loaders read is fetched (ALLOW: config and generation config, safetensors and their
index, tokenizer files, chat template) — never pickles, never code. The client downloads into
`.incomplete` files moved into place when whole, resumes an interrupted file where it stopped, and
refuses an incomplete cached snapshot offline; unmask's loader is strict besides (every shard the
index names, every weight present). A local folder or an embedded model of the same name wins
over a Hub name (unmask.loading.resolve_model_path). Every failure is an UnmaskError that names the
model and what to do.
"""

import errno
import os
import re
from pathlib import Path

from unmask.errors import UnmaskError

# the files unmask's loaders and tokenizer read
ALLOW = ["config.json", "generation_config.json", "*.safetensors", "model.safetensors.index.json", "tokenizer.json",
         "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json", "added_tokens.json",
         "chat_template.jinja"]
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*(@[A-Za-z0-9_./-]+)?(:[A-Za-z0-9_.-]+)?")


def is_hub_name(text: str) -> bool:
    """Whether `text` has the shape of a Hub name (`org/name`, `org/name@revision`, either with
    `:TAG`, a GGUF file's tag)."""
    return bool(_NAME.fullmatch(text)) and ".." not in text and not text.endswith((".json", ".safetensors",
                                                                                    ".gguf"))


def split_name(text: str) -> tuple[str, str | None]:
    repo, _, revision = split_tag(text)[0].partition("@")
    return repo, revision or None


def split_tag(text: str) -> tuple[str, str | None]:
    """(the name without its GGUF tag, the tag or None)."""
    name, _, tag = text.partition(":")
    return name, tag or None


def pick_gguf(name: str, files: list[str], tag: str | None) -> str | None:
    """The .gguf file of a repository (`files`) that `tag` names (the only one without a tag), or
    None when it holds none; several, or none with the tag, is an error listing them."""
    ggufs = sorted(f for f in files if f.endswith(".gguf"))
    if not ggufs:
        return None
    chosen = [f for f in ggufs if tag is None or tag.lower() in f.rsplit("/", 1)[-1].lower()]
    if tag is None and len(ggufs) > 1 or not chosen or len(chosen) > 1:
        listed = ", ".join(ggufs[:12]) + (f" (and {len(ggufs) - 12} more)" if len(ggufs) > 12 else "")
        what = (f"no .gguf file's name holds {tag!r}" if not chosen else
                f"{len(chosen)} .gguf files" + (f" hold {tag!r}" if tag else "") + "; name one by its tag")
        raise UnmaskError(f"model {name!r}: {what} (e.g. {split_tag(name)[0]}:Q8_0): {listed}", param="model")
    if re.search(r"-\d{5}-of-\d{5}\.gguf$", chosen[0]):
        raise UnmaskError(f"model {name!r}: {chosen[0]} is one part of a split GGUF; unmask reads whole files "
                          "(join the parts with llama.cpp's llama-gguf-split --merge)", param="model")
    return chosen[0]


def _endpoint() -> str:
    from huggingface_hub import constants

    return constants.ENDPOINT


def _cache() -> str:
    from huggingface_hub import constants

    return constants.HF_HUB_CACHE


def held_layout(files: list[str]) -> str | None:
    """None when `files` (a repository's) hold a layout unmask reads; else what they hold instead."""
    names = [f.rsplit("/", 1)[-1] for f in files]
    weights = [f for f in names if f.endswith(".safetensors")]
    if "config.json" in files and weights:
        return None
    kinds = []
    if any(f.endswith(".gguf") for f in names):
        kinds.append("GGUF files (" + ", ".join(f for f in names if f.endswith(".gguf"))[:120] + ")")
    if any(f.endswith((".bin", ".pt", ".pth", ".ckpt")) for f in names):
        kinds.append("PyTorch pickles (" + ", ".join(f for f in names if f.endswith((".bin", ".pt", ".pth", ".ckpt")))[:120]
                     + "), which unmask never loads: convert them to safetensors")
    if "config.json" not in files:
        kinds.append("no config.json")
    if not weights and not kinds:
        kinds.append("no safetensors weights")
    listed = ", ".join(sorted(files)[:8]) + (f" (and {len(files) - 8} more)" if len(files) > 8 else "")
    return "; ".join(kinds) + f" — its files: {listed or 'none'}"


def download(name: str) -> Path:
    """The local folder of the Hub model `name` (downloaded into the Hub cache if needed)."""
    from huggingface_hub import HfApi, constants, hf_hub_download, snapshot_download

    repo, revision = split_name(name)
    tag = split_tag(name)[1]
    try:
        if constants.HF_HUB_OFFLINE and tag is not None:  # the cached snapshot's GGUF files
            folder = Path(snapshot_download(repo, revision=revision, allow_patterns=["*.gguf"]))
            chosen = pick_gguf(name, [p.name for p in folder.glob("*.gguf")], tag)
            if chosen is None:
                raise UnmaskError(f"model {name!r}: offline, and no GGUF file of it is in the cache", param="model")
            return folder / chosen
        if not constants.HF_HUB_OFFLINE:
            info = HfApi().model_info(repo, revision=revision)
            files = [s.rfilename for s in info.siblings or []]
            problem = held_layout(files)
            gguf = pick_gguf(name, files, tag) if problem or tag else None
            if gguf is not None:
                return Path(hf_hub_download(repo, gguf, revision=revision))
            if tag is not None:
                raise UnmaskError(f"model {name!r}: the tag {tag!r} names a GGUF file, and the repository holds none",
                                  param="model")
            if problem:
                raise UnmaskError(f"model {name!r}: the Hub repository holds no checkpoint layout unmask reads "
                                  f"(config.json and safetensors weights): it has {problem}", param="model")
        return Path(snapshot_download(repo, revision=revision, allow_patterns=ALLOW))
    except UnmaskError:
        raise
    except Exception as e:  # huggingface_hub's errors, the network's and the disk's, named for the user
        raise UnmaskError(explain(name, e), param="model") from None


TOKENIZER_FILES = ["tokenizer.json", "tokenizer_config.json", "vocab.json", "merges.txt", "special_tokens_map.json",
                   "added_tokens.json", "chat_template.jinja"]


def download_tokenizer(name: str, model: str) -> Path:
    """The local folder of the tokenizer files (only those) of the Hub repository `name`: the
    tokenizer a release that ships none (`model`) was trained with."""
    from huggingface_hub import snapshot_download

    repo, revision = split_name(name)
    try:
        return Path(snapshot_download(repo, revision=revision, allow_patterns=TOKENIZER_FILES))
    except Exception as e:  # huggingface_hub's errors, the network's and the disk's, named for the user
        raise UnmaskError(f"{model} ships no tokenizer; it uses {name}'s, which could not be fetched: "
                          f"{explain(name, e)} (or put {name}'s tokenizer.json in the model folder)",
                          param="model") from None


def explain(name: str, e: Exception) -> str:
    """What went wrong resolving `name`, and what to do, in one or two sentences."""
    from huggingface_hub import errors

    incomplete = getattr(errors, "IncompleteSnapshotError", ())
    offline = os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")
    where = f"the Hub ({_endpoint()})"
    if isinstance(e, errors.GatedRepoError):
        return (f"model {name!r} is gated: accept its conditions at {_endpoint()}/{split_name(name)[0]} and set "
                "HF_TOKEN (or run `hf auth login`)")
    if isinstance(e, errors.RepositoryNotFoundError):
        return (f"model {name!r}: no such repository on {where}, or it is private and no valid token was sent "
                "(set HF_TOKEN or run `hf auth login`); a local folder of that name would be used first")
    if isinstance(e, errors.RevisionNotFoundError):
        return f"model {name!r}: the repository has no revision {split_name(name)[1]!r}"
    if incomplete and isinstance(e, incomplete):
        return (f"model {name!r} is only partly downloaded in the Hub cache ({_cache()}) and {where} cannot be "
                "reached to finish it; it is not loaded. Run again with the network to complete the download")
    if isinstance(e, errors.LocalEntryNotFoundError) or isinstance(e, (ConnectionError, TimeoutError)) or \
            type(e).__name__ in ("ConnectError", "ConnectTimeout", "ReadTimeout", "OfflineModeIsEnabled"):
        if offline:
            return (f"model {name!r} is not in the Hub cache ({_cache()}) and HF_HUB_OFFLINE is set: download it "
                    "once with the network (the same command), then HF_HUB_OFFLINE=1 uses the cache")
        return (f"model {name!r}: {where} cannot be reached and the model is not in the cache ({_cache()}); check "
                "the network or HF_ENDPOINT, or download it once and run offline with HF_HUB_OFFLINE=1")
    if isinstance(e, OSError) and e.errno in (errno.ENOSPC, errno.EDQUOT):
        return (f"model {name!r}: the disk is full while downloading into {_cache()}; free space or set "
                "HF_HUB_CACHE to a folder on a larger disk (the partial download resumes)")
    if isinstance(e, errors.HfHubHTTPError):
        status = getattr(getattr(e, "response", None), "status_code", None)
        return f"model {name!r}: {where} answered HTTP {status}: {str(e).splitlines()[0]}"
    return f"model {name!r}: downloading from {where} failed: {type(e).__name__}: {e}"
