"""An OpenAI-compatibility suite nobody here wrote: CompatCanary (npm `compatcanary`, pinned in
.ci/run) scans a running `unmask serve` on loopback. Its probes: model discovery, chat
completions, chat streaming, a forced tool call, strict structured output, and the Responses API
(its "modern" profile: Chat Completions and the Responses API). The model is a tiny random LLaDA with a byte-level BPE tokenizer, so the
probes' English prompts tokenize (the embedded models' word-level vocabulary would refuse them
by name). Every probe's outcome is pinned here and listed in docs/serving.md: what fails is
what unmask does not serve."""

import json
import shutil
import subprocess

import pytest

pytest.importorskip("fastapi")

from checkpoints import write_llada  # noqa: E402

from unmask import LLM  # noqa: E402

# probe id -> the status unmask gets (docs/serving.md, "Clients nobody here wrote")
EXPECTED = {
    "models.list": "pass",
    "chat.basic": "pass",
    "chat.streaming": "pass",
    "chat.structured_output": "pass",
    "chat.tool_call": "pass",  # a forced call (tool_choice named or "required"; "auto" is refused by name)
    "responses.basic": "pass",
    # the random model never ends an answer: a response cut at max_output_tokens is "incomplete"
    # and its stream ends with response.incomplete, as OpenAI's does (the probe wants
    # response.completed; the embedded model's responses complete: tests/test_responses.py)
    "responses.streaming": "fail",
}


def _canary() -> str | None:
    return shutil.which("compatcanary")


@pytest.mark.skipif(_canary() is None, reason="CompatCanary is not installed (npm install -g compatcanary@0.2.2)")
def test_compatcanary_scan(tmp_path):
    from test_server import Server

    llm = LLM(str(write_llada(tmp_path / "bpe", bpe=True)))
    server = Server(llm, served_model_name="canary")
    report = tmp_path / "report.json"
    try:
        done = subprocess.run([_canary(), "scan", "--base-url", server.url + "/v1", "--model", "canary",
                               "--profile", "modern", "--format", "json", "--output", str(report),
                               "--fail-on", "never", "--timeout", "60"],
                              capture_output=True, text=True, timeout=300)
    finally:
        server.stop()
    assert done.returncode == 0, done.stderr
    got = json.loads(report.read_text())
    results = {r["id"]: r for r in got["results"]}
    assert {k: r["status"] for k, r in results.items()} == EXPECTED, {k: r.get("summary") for k, r in results.items()}
