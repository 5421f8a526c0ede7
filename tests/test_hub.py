"""Models by their Hub names (unmask.hub) through the real `huggingface_hub` client against a
stand-in Hub on 127.0.0.1 (tests/hub_standin.py, HF_ENDPOINT): downloads only what the loader
reads, answers as the same files from a folder, revisions, the cache offline, resumed downloads,
a partial snapshot never loaded, and each failure a short message naming the problem."""

import errno
import importlib
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from hub_standin import HubStandIn, Repo, folder_files
from unmask import LLM, GenerationParams
from unmask.errors import UnmaskError

CKPT = Path(__file__).parent / "data" / "a2d-upstream" / "ckpt-qwen3"
NAME = "dllm-test/tiny-a2d"
EXTRA = {"pytorch_model.bin": b"\x80\x02 not a pickle unmask ever reads", "modeling_qwen3.py": b"raise SystemExit",
         "README.md": b"# tiny"}
PROMPTS = [[4, 180, 42, 104], [190, 90]]
PARAMS = GenerationParams(compat="dllm-mdlm", gen_length=8, block_length=4, steps=8)


def _reload_constants():
    import huggingface_hub.constants

    importlib.reload(huggingface_hub.constants)


@pytest.fixture
def hub(tmp_path, monkeypatch):
    """The stand-in Hub with a tiny A2D model, and the client's environment pointed at it (a fresh
    cache per test)."""
    h = HubStandIn()
    h.repos[NAME] = Repo({**folder_files(CKPT), **EXTRA})
    for k in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_HUB_OFFLINE"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("HF_ENDPOINT", h.url)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path / "hf" / "hub"))
    monkeypatch.setenv("HF_HUB_DISABLE_TELEMETRY", "1")
    _reload_constants()
    yield h
    h.close()
    monkeypatch.undo()
    _reload_constants()


def _offline(monkeypatch, on: bool = True):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1" if on else "0")
    _reload_constants()


def _tokens(llm):
    return [r.raw_ids for r in llm.generate(PROMPTS, PARAMS).results]


def test_a_hub_name_downloads_what_the_loader_reads_and_answers_as_the_folder(hub):
    llm = LLM(NAME)
    assert Path(os.environ["HF_HUB_CACHE"]) in llm.path.parents  # the Hub cache, not a folder of unmask's
    assert sorted(hub.downloads()) == sorted(folder_files(CKPT))  # never the pickle, the code or the card
    assert not (llm.path / "pytorch_model.bin").exists() and not (llm.path / "modeling_qwen3.py").exists()
    assert _tokens(llm) == _tokens(LLM(CKPT))


def test_offline_the_cache_answers_without_a_request(hub, monkeypatch):
    first = LLM(NAME)
    _offline(monkeypatch)
    seen = len(hub.log)
    again = LLM(NAME)
    assert len(hub.log) == seen and again.path == first.path
    assert _tokens(again) == _tokens(first)


def test_a_revision_by_name(hub):
    hub.repos[NAME].revisions["v0.1"] = "a" * 40
    llm = LLM(f"{NAME}@v0.1")
    assert llm.path.name == "a" * 40
    with pytest.raises(UnmaskError, match=r"has no revision 'v9'"):
        LLM(f"{NAME}@v9")


def _large_checkpoint(folder: Path) -> Path:
    """ckpt-qwen3's layout with a 24000-row vocabulary: one 12 MB weights file (the client reads a
    download in 10 MiB chunks, so a drop after the first can be resumed from it)."""
    import torch
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    for f in ("tokenizer.json", "tokenizer_config.json"):
        shutil.copy(CKPT / f, folder / f)
    cfg = json.loads((CKPT / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**cfg, "vocab_size": 24000}))
    from safetensors import safe_open

    with safe_open(CKPT / "model.safetensors", "pt") as f:
        g = torch.Generator().manual_seed(0)
        t = {k: f.get_tensor(k) for k in f.keys()}
    for k in ("model.embed_tokens.weight", "lm_head.weight"):
        t[k] = torch.cat([t[k], torch.randn(24000 - 320, t[k].shape[1], generator=g) * 0.02])
    save_file(t, folder / "model.safetensors", metadata={"format": "pt"})
    return folder


def test_an_interrupted_download_resumes(hub, tmp_path):
    """The connection drops part-way through the weights: the client asks for the rest (a Range
    request from the end of the last whole chunk it kept) and the model loads whole."""
    big = _large_checkpoint(tmp_path / "big")
    hub.repos["x/big"] = Repo(folder_files(big))
    hub.repos["x/big"].cut_once["model.safetensors"] = 10_500_000
    llm = LLM("x/big")
    ranges = [r for m, p, r in hub.log if m == "GET" and p.endswith("/model.safetensors") and r]
    assert ranges == [f"bytes={10 << 20}-"]
    assert (llm.path / "model.safetensors").read_bytes() == (big / "model.safetensors").read_bytes()
    assert _tokens(llm) == _tokens(LLM(big))


def test_a_killed_download_is_never_loaded_and_the_next_run_finishes_it(hub, monkeypatch):
    """A download killed while the weights arrive leaves a snapshot without them: offline it is
    named as partly downloaded and not loaded; the next run fetches only what is missing."""
    hub.repos[NAME].slow["model.safetensors"] = 0.5
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1"}
    code = "from unmask import LLM; LLM(%r)" % NAME
    proc = subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 60
        while not any(m == "GET" and p.endswith("/model.safetensors") for m, p, _ in hub.log):
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        time.sleep(0.6)  # some of the weights have arrived
    finally:
        proc.kill()
        proc.wait()
    _offline(monkeypatch)
    with pytest.raises(UnmaskError, match="only partly downloaded.*not loaded"):
        LLM(NAME)
    _offline(monkeypatch, False)
    hub.repos[NAME].slow.clear()
    done = len(hub.downloads())
    llm = LLM(NAME)
    assert hub.downloads()[done:] == ["model.safetensors"]  # the finished files are kept
    assert _tokens(llm) == _tokens(LLM(CKPT))


def test_a_local_folder_or_embedded_model_shadows_a_hub_name(hub, tmp_path, monkeypatch):
    local = tmp_path / "here" / NAME
    shutil.copytree(CKPT.parent / "ckpt-llama", local)
    monkeypatch.chdir(tmp_path / "here")
    seen = len(hub.log)
    assert LLM(NAME).path == Path(NAME) and len(hub.log) == seen  # the local folder, no request


@pytest.mark.parametrize("setup, name, message", [
    (lambda h: None, "nobody/nothing", r"'nobody/nothing': no such repository .* private .*HF_TOKEN"),
    (lambda h: setattr(h.repos[NAME], "private", True), NAME, r"no such repository .* private .*HF_TOKEN"),
    (lambda h: setattr(h.repos[NAME], "gated", True), NAME, r"is gated: accept its conditions at .*HF_TOKEN"),
    (lambda h: h.repos.__setitem__("x/bins", Repo({"config.json": b"{}", "pytorch_model.bin": b"p"})), "x/bins",
     r"holds no checkpoint layout .*PyTorch pickles \(pytorch_model.bin\).*convert them to safetensors"),
    (lambda h: h.repos.__setitem__("x/gguf", Repo({"m-Q4_K_M.gguf": b"GGUF", "m-Q8_0.gguf": b"GGUF"})), "x/gguf",
     r"2 .gguf files; name one by its tag \(e.g. x/gguf:Q8_0\): m-Q4_K_M.gguf, m-Q8_0.gguf"),
    (lambda h: h.repos.__setitem__("x/gguf", Repo({"m-Q4_K_M.gguf": b"GGUF"})), "x/gguf:Q5_K",
     r"no .gguf file's name holds 'Q5_K'"),
    (lambda h: h.repos.__setitem__("x/gguf", Repo({"m-Q8_0-00001-of-00002.gguf": b"GGUF"})), "x/gguf:Q8_0",
     r"one part of a split GGUF"),
    (lambda h: None, f"{NAME}:Q8_0", r"the tag 'Q8_0' names a GGUF file, and the repository holds none"),
])
def test_hub_errors_are_short_and_name_the_problem(hub, setup, name, message):
    setup(hub)
    with pytest.raises(UnmaskError, match=message) as e:
        LLM(name)
    assert len(str(e.value)) < 400 and "Traceback" not in str(e.value)


def test_a_private_model_with_a_token(hub, monkeypatch):
    hub.repos[NAME].private = True
    monkeypatch.setenv("HF_TOKEN", HubStandIn.TOKEN)
    assert _tokens(LLM(NAME)) == _tokens(LLM(CKPT))


def test_no_network_and_offline_without_the_model_say_what_to_do(hub, monkeypatch):
    hub.close()  # nothing listens at HF_ENDPOINT any more
    with pytest.raises(UnmaskError, match=r"cannot be reached .*not in the cache .*HF_HUB_OFFLINE=1"):
        LLM(NAME)
    _offline(monkeypatch)
    with pytest.raises(UnmaskError, match=r"not in the Hub cache .*HF_HUB_OFFLINE is set: download it once"):
        LLM(NAME)


def test_a_full_disk_is_named(hub, monkeypatch):
    """The disk filling up mid-download (the client's OSError ENOSPC, raised here at its call)."""
    import huggingface_hub

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(huggingface_hub, "snapshot_download", full)
    with pytest.raises(UnmaskError, match=r"disk is full .*HF_HUB_CACHE"):
        LLM(NAME)


def test_the_cli_takes_a_hub_name_and_shows_the_download(hub, tmp_path):
    """`unmask generate --model org/name` in a process of its own: HF_ENDPOINT and the cache from
    the environment, progress bars on stderr, the answer the folder gives."""
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "OMP_NUM_THREADS": "1", "TQDM_POSITION": "-1"}
    run = subprocess.run([sys.executable, "-m", "unmask", "generate", "--model", NAME, "--prompt-ids",
                          "4,180,42,104;190,90", "--compat", "dllm-mdlm", "--gen-length", "8", "--block-length", "4",
                          "--steps", "8", "--json"], env=env, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    assert json.loads(run.stdout)["generated_ids"] == _tokens(LLM(CKPT))
    # the client's bars: files, and bytes with their rate (on a terminal; TQDM_POSITION=-1 shows them through a pipe)
    assert "Fetching 4 files" in run.stderr and "Download complete" in run.stderr and "345kB" in run.stderr


def test_a_repository_of_gguf_files_by_its_tag(hub, monkeypatch):
    """`org/name:TAG` (llama.cpp's -hf): only the file the tag names is fetched, and it is the
    model the file is; offline, the cache answers."""
    data = Path(__file__).parent / "data" / "gguf-upstream"
    hub.repos["tiny/llada-GGUF"] = Repo({"llada-F32.gguf": (data / "llada-f32.gguf").read_bytes(),
                                         "llada-Q8_0.gguf": (data / "llada-q8_0.gguf").read_bytes(),
                                         "README.md": b"# tiny"})
    llm = LLM("tiny/llada-GGUF:q8_0")
    assert llm.path.name == "llada-Q8_0.gguf" and hub.downloads() == ["llada-Q8_0.gguf"]
    local = LLM(data / "llada-q8_0.gguf")
    ids = [[5, 6, 7]]
    p = local.default_params(gen_length=8)
    assert [r.raw_ids for r in llm.generate(ids, p).results] == [r.raw_ids for r in local.generate(ids, p).results]
    _offline(monkeypatch)
    seen = len(hub.log)
    assert LLM("tiny/llada-GGUF:Q8_0").path == llm.path and len(hub.log) == seen

