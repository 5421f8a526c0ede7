"""lm-evaluation-harness adapter: the model class `unmask` (lm-eval is an optional dependency).

lm-eval 0.4.13 resolves `--model NAME` against its own registry before any user code runs and has
no plugin discovery for models, so `lm_eval --model unmask` needs the class registered first:
`unmask lm-eval ARGS` (or `python -m unmask.bench.harness ARGS`) registers it and hands ARGS to
lm-eval's own command line, unchanged. It also adds `--include_path` for the task `gsm8k_unmask`:
lm-eval's `gsm8k` task (5-shot `Question: …\\nAnswer:`, strict and flexible extraction,
exact_match with lm-eval's normalisation) over the packaged offline GSM8K copy.

    unmask lm-eval --model unmask --model_args model=DIR,gen_length=256,block_length=32,policy=threshold \\
        --tasks gsm8k_unmask --limit 50

model_args: `model` (folder, or default / default-ar), `dtype`, `device`, `chat` (true: wrap the
whole context as one user message, as LLaDA's Instruct evaluation does), `mc_num` (Monte-Carlo
samples of the likelihood bound), and every GenerationParams field (gen_length, block_length,
steps, policy, threshold, cache, ...). As in LLaDA's and Fast-dLLM's adapters, a diffusion model
decodes a fixed `gen_length` (lm-eval's `max_gen_toks` is not used) and the text is cut at the
first `until` string afterwards.

loglikelihood: exact for an autoregressive twin; for a diffusion model, LLaDA's Monte-Carlo bound
(mask a stratified number k of the continuation's tokens, cross-entropy on the masked ones weighted
by L/k, averaged over `mc_num` draws), with is_greedy False as LLaDA recommends.
"""

import dataclasses
import logging
import sys
import tempfile
from pathlib import Path

import torch
import torch.nn.functional as F

from unmask.errors import UnmaskError

try:
    from lm_eval.api.model import LM
    from lm_eval.api.registry import register_model
except ImportError as e:  # pragma: no cover - exercised only without lm-eval
    raise UnmaskError("the lm-eval adapter needs lm-eval: pip install 'unmask[lmeval]'") from e

from unmask.bench import gsm8k
from unmask.bench.common import cut_at_stop
from unmask.llm import LLM, default_device
from unmask.params import PARAM_FIELDS, check_fields, coerce, resolve_params

log = logging.getLogger(__name__)


def _int_arg(name: str, value, minimum: int) -> int:
    try:
        v = int(str(value).strip())
    except ValueError:
        raise UnmaskError(f"model_args {name}={value!r} is not an integer") from None
    if v < minimum:
        raise UnmaskError(f"model_args {name}={value!r} must be >= {minimum}")
    return v


@register_model("unmask")
class UnmaskLM(LM):
    def __init__(self, model: str | None = None, dtype: str | None = None, device: str | None = None,
                 batch_size: int | str = 1, chat: bool | str = False, mc_num: int = 32, seed: int = 1234,
                 max_batch_size: int | None = None, **decoding) -> None:
        super().__init__()
        unknown = sorted(set(decoding) - set(PARAM_FIELDS))
        if unknown:
            raise UnmaskError(f"unknown model_args {unknown}; decoding fields are {', '.join(PARAM_FIELDS)}")
        values = {k: coerce(k, v, f"model_args {k}") for k, v in decoding.items()}
        check_fields({k: v for k, v in values.items() if v is not None})
        if device and str(device).startswith("cuda") and not torch.cuda.is_available():
            # lm-eval's command line asks for cuda:0 unless told otherwise
            log.warning("device %s requested but CUDA is not available; using the CPU", device)
            device = "cpu"
        self.llm = LLM(model, dtype=dtype, device=device or default_device())
        # evaluation runs the reference setting unless model_args say otherwise (like `unmask eval`)
        self.params = resolve_params(values, self.llm.generation_defaults, fast=False,
                                     block_size=self.llm.arch.block_size)
        # lm-eval passes batch_size "auto" / "auto:N" for its own models; a number is used as is
        self.batch_size = _int_arg("batch_size", batch_size, 1) if str(batch_size).strip().isdigit() else 1
        if str(chat).lower() not in ("true", "false"):
            raise UnmaskError(f"model_args chat={chat!r} must be true or false")
        self.chat = str(chat).lower() == "true"
        self.mc_num = _int_arg("mc_num", mc_num, 1)
        self.seed = _int_arg("seed", seed, 0)
        self._templated = False
        self._warned = False

    # --- generation -----------------------------------------------------------------------------
    def generate_until(self, requests, disable_tqdm: bool = False) -> list[str]:
        out: list[str] = []
        args = [r.args for r in requests]
        for i in range(0, len(args), self.batch_size):
            chunk = args[i : i + self.batch_size]
            params = self.params
            kw = chunk[0][1] or {}
            if kw.get("do_sample") and float(kw.get("temperature", 0) or 0) > 0:
                params = dataclasses.replace(params, temperature=float(kw["temperature"])).check()
            ids = [self._encode_context(ctx) for ctx, _ in chunk]
            res = self.llm.generate(ids, params)
            for (_, kw), r in zip(chunk, res.results):
                out.append(cut_at_stop(r.text, (kw or {}).get("until") or ()))
        return out

    def _encode_context(self, context: str, room: int | None = None) -> list[int]:
        """Token ids of a context, cut from the left (keeping a leading start token) to leave
        `room` positions (default: gen_length) in the model's window, as lm-eval's HF model does."""
        tok = self.llm.tokenizer
        if self._templated:  # lm-eval rendered the chat template already (it writes its own BOS)
            ids = tok.encode(context, add_special_tokens=False)
        else:
            ids = tok.encode_prompt(context, self.chat)
        limit = self.llm.arch.max_positions - (self.params.gen_length if room is None else room)
        if len(ids) > limit:
            if not self._warned:
                log.warning("contexts longer than %d tokens are cut from the left (first: %d tokens)", limit, len(ids))
                self._warned = True
            keep = ids[:1] if ids[0] == self.llm.token_ids.bos else []
            ids = keep + ids[len(ids) - (limit - len(keep)) :]
        return ids

    def apply_chat_template(self, chat_history: list[dict], add_generation_prompt: bool = True) -> str:
        self._templated = True
        return self.llm.tokenizer.apply_chat_template(chat_history, add_generation_prompt)

    @property
    def device(self) -> torch.device:
        return next(self.llm.model.parameters()).device

    @property
    def tokenizer_name(self) -> str:
        return str(self.llm.path or "unmask")

    # --- likelihood -----------------------------------------------------------------------------
    def loglikelihood(self, requests, disable_tqdm: bool = False) -> list[tuple[float, bool]]:
        return [self._loglikelihood(*r.args) for r in requests]

    def loglikelihood_rolling(self, requests, disable_tqdm: bool = False) -> list[float]:
        return [self._loglikelihood("", r.args[0])[0] for r in requests]

    def _loglikelihood(self, context: str, continuation: str) -> tuple[float, bool]:
        tok = self.llm.tokenizer
        target = tok.encode(continuation, add_special_tokens=False)
        prompt = self._encode_context(context, room=len(target)) if context else tok.encode("")
        if not target:
            return 0.0, True
        if not prompt:
            raise UnmaskError("loglikelihood needs a context or a start-of-text token to condition on")
        return likelihood(self.llm, prompt, target, self.mc_num, self.seed)


@torch.no_grad()
def likelihood(llm: LLM, prompt: list[int], target: list[int], mc_num: int = 32, seed: int = 1234) -> tuple[float, bool]:
    """log p(target | prompt): exact for a causal model (and whether greedy decoding gives the
    target); for a diffusion model, LLaDA's Monte-Carlo lower bound (is_greedy False)."""
    model = llm.model
    if model.config.kind == "renoise":
        raise UnmaskError(f"loglikelihood of a renoising model ({model.config.family}) is not implemented (no bound "
                          "for uniform-token corruption here); use generate_until tasks")
    device = next(model.parameters()).device
    P, L = len(prompt), len(target)
    seq = torch.tensor(prompt + target, device=device)[None]
    pos = torch.arange(P + L, device=device)[None]
    tgt = seq[:, P:]
    if model.config.causal:
        logits = model(seq, pos, logits_slice=slice(P - 1, P + L - 1)).float()
        logp = torch.log_softmax(logits, -1).gather(-1, tgt[..., None]).sum()
        return float(logp), bool((logits.argmax(-1) == tgt).all())
    gen = torch.Generator().manual_seed(seed)
    shift = model.config.logit_shift
    # stratified numbers of masked tokens, as LLaDA's get_loglikelihood draws them
    k0 = int(torch.randint(1, L + 1, (), generator=gen))
    k = torch.round(torch.linspace(float(k0), k0 + (mc_num - 1) * (L / mc_num), mc_num)).long()
    k = ((k - 1) % L) + 1
    order = torch.rand(mc_num, L, generator=gen).argsort(-1)
    masked = (order < k[:, None]).to(device)
    ids = seq.repeat(mc_num, 1)
    ids[:, P:][masked] = llm.token_ids.mask
    logits = model(ids, pos.expand(mc_num, -1), logits_slice=slice(P - shift, P + L - shift)).float()
    ce = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), tgt.expand(mc_num, -1).reshape(-1),
                         reduction="none").view(mc_num, L)
    weight = (L / k.to(device).float())[:, None]
    return float(-((ce * masked) * weight).sum() / mc_num), False


GSM8K_YAML = """task: gsm8k_unmask
tag: [unmask]
dataset_path: json
dataset_name: null
dataset_kwargs:
  data_files:
    train: {train}
    test: {test}
output_type: generate_until
training_split: train
fewshot_split: train
test_split: test
doc_to_text: "Question: {{{{question}}}}\\nAnswer:"
doc_to_target: "{{{{answer}}}}"
target_delimiter: " "
fewshot_delimiter: "\\n\\n"
num_fewshot: 5
generation_kwargs:
  until: ["Question:", "</s>", "<|im_end|>"]
  do_sample: false
  temperature: 0.0
filter_list:
  - name: strict-match
    filter:
      - function: regex
        regex_pattern: "#### (\\\\-?[0-9\\\\.\\\\,]+)"
      - function: take_first
  - name: flexible-extract
    filter:
      - function: regex
        group_select: -1
        regex_pattern: "(-?[$0-9.,]{{2,}})|(-?[0-9]+)"
      - function: take_first
metric_list:
  - metric: exact_match
    aggregation: mean
    higher_is_better: true
    ignore_case: true
    ignore_punctuation: false
    regexes_to_ignore: [",", "\\\\$", "(?s).*#### ", "\\\\.$"]
metadata:
  version: 3.0
"""


def write_task_dir(folder: str | Path, data: str | Path | None = None) -> Path:
    """Write the `gsm8k_unmask` task YAML over the packaged GSM8K copy (or `data`/{train,test}.jsonl)."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    if data is None:
        train, test = gsm8k.DATA / "gsm8k_train_first8.jsonl", gsm8k.DATA / "gsm8k_test.jsonl"
    else:
        train, test = Path(data) / "train.jsonl", Path(data) / "test.jsonl"
    for f in (train, test):
        if not f.exists():
            raise UnmaskError(f"GSM8K file {f} does not exist")
    (folder / "gsm8k_unmask.yaml").write_text(GSM8K_YAML.format(train=train.resolve(), test=test.resolve()))
    return folder


def main(argv: list[str] | None = None) -> int:
    """`lm_eval` with the `unmask` model registered and the `gsm8k_unmask` task on the include path."""
    from lm_eval.__main__ import cli_evaluate

    argv = list(sys.argv[1:] if argv is None else argv)
    with tempfile.TemporaryDirectory(prefix="unmask-lm-eval-") as tmp:
        write_task_dir(tmp)
        if "--include_path" not in argv:
            argv += ["--include_path", tmp]
        old = sys.argv
        sys.argv = ["lm_eval", *argv]
        try:
            cli_evaluate()
        finally:
            sys.argv = old
    return 0


if __name__ == "__main__":
    sys.exit(main())
