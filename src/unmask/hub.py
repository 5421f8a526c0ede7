"""Models named by their Hugging Face Hub names: `org/name` or `org/name@revision`, resolved to a
folder in the Hub cache through `huggingface_hub` (its cache and environment: HF_HOME /
HF_HUB_CACHE, HF_TOKEN, HF_HUB_OFFLINE, HF_ENDPOINT for mirrors).

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
_NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*/[A-Za-z0-9][A-Za-z0-9_.-]*(@[A-Za-z0-9_./-]+)?")


def is_hub_name(text: str) -> bool:
    """Whether `text` has the shape of a Hub name (`org/name`, `org/name@revision`)."""
    return bool(_NAME.fullmatch(text)) and ".." not in text and not text.endswith((".json", ".safetensors"))


def split_name(text: str) -> tuple[str, str | None]:
    repo, _, revision = text.partition("@")
    return repo, revision or None


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
    from huggingface_hub import HfApi, constants, snapshot_download

    repo, revision = split_name(name)
    try:
        if not constants.HF_HUB_OFFLINE:
            info = HfApi().model_info(repo, revision=revision)
            problem = held_layout([s.rfilename for s in info.siblings or []])
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
