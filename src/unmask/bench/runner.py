"""`unmask bench`: quality and cost of every configuration on the same held-out examples, for the
diffusion model and its AR twin, with the roofline prediction beside each measurement.

Timing: the decode of each batch (every forward, prefill / cache refreshes included, and the
decode loop); tokenisation and detokenisation are excluded. Tokens are counted up to and
including end of text (the padding after it is never counted); prompt tokens are never counted.
"""

import os
import platform
import resource
import subprocess
import time
from dataclasses import dataclass, field

import torch

from unmask.bench.grid import BenchConfig
from unmask.bench.hardware import for_device
from unmask.bench.roofline import ModelCost, Roofline
from unmask.bench.stats import mcnemar_exact, paired_bootstrap, percentile, wilson_interval
from unmask.evaluate import run_task
from unmask.llm import LLM
from unmask.tasks import SPLITS

TIMER_INCLUDES = ("decode of each batch: every forward (prefill / cache refreshes included) and the decode "
                  "loop; excludes tokenisation and detokenisation")


@dataclass
class Measured:
    config: BenchConfig
    flags: dict[str, list[bool]] = field(default_factory=dict)  # per task, per example: exact / valid
    token_acc: dict[str, float] = field(default_factory=dict)
    latencies: list[float] = field(default_factory=list)  # per request, seconds
    seconds: float = 0.0  # summed decode time
    predicted_seconds: float = 0.0  # roofline prediction for the same forwards
    tokens: int = 0  # generated, up to and including end of text
    row_forwards: int = 0  # forwards summed over requests (NFE per request, summed)
    positions: int = 0  # positions recomputed, summed over row-forwards
    steps: int = 0  # batched forwards
    peak_rss_mib: float = 0.0

    def summary(self, baseline: "Measured | None") -> dict:
        all_flags = [f for t in sorted(self.flags) for f in self.flags[t]]
        k, n = sum(all_flags), len(all_flags)
        lo, hi = wilson_interval(k, n)
        out = {
            "config": self.config.key(), "label": self.config.label,
            "accuracy": k / n, "accuracy_ci95": [lo, hi], "n": n,
            "per_task": {t: {"exact": sum(f) / len(f), "ci95": list(wilson_interval(sum(f), len(f))),
                             "token_accuracy": self.token_acc[t]} for t, f in sorted(self.flags.items())},
            # every example's exact match, in order ("1"/"0"), so that any pair can be compared later
            "flags": {t: "".join("1" if x else "0" for x in f) for t, f in sorted(self.flags.items())},
            "nfe_per_request": self.row_forwards / n,
            "tau": self.tokens / max(self.row_forwards, 1),
            "G": self.positions / max(self.row_forwards, 1),
            "positions_per_request": self.positions / n,
            "tokens_per_s": self.tokens / self.seconds,
            "latency_ms": {f"p{q}": 1e3 * percentile(self.latencies, q) for q in (50, 95, 99)},
            "ms_per_step": 1e3 * self.seconds / max(self.steps, 1),
            "seconds": self.seconds,
            "peak_rss_mib": self.peak_rss_mib,
            "predicted_seconds": self.predicted_seconds,
            "prediction_error": (self.predicted_seconds - self.seconds) / self.seconds,
        }
        if baseline is not None and baseline is not self:
            base = [f for t in sorted(baseline.flags) for f in baseline.flags[t]]
            d, dlo, dhi = paired_bootstrap(all_flags, base)
            out["vs_baseline"] = {"baseline": baseline.config.label, "diff": d, "ci95": [dlo, dhi],
                                  "mcnemar_p": mcnemar_exact(all_flags, base)}
        return out


def _roofline(llm: LLM, hw) -> Roofline:
    bytes_per = next(llm.model.parameters()).element_size()
    return Roofline(hw, ModelCost.from_arch(llm.arch, bytes_per, attention=True))


def measure(llm: LLM, cfg: BenchConfig, tasks: list[str], n: int, roof: Roofline, progress=None,
            split: str = "selection") -> Measured:
    m = Measured(cfg)
    params = cfg.params()
    for task in tasks:
        run = run_task(llm, task, n, params, cfg.batch, progress=progress, split=split)
        m.flags[task] = run.flags
        m.token_acc[task] = sum(run.token_accuracy) / run.n
        m.seconds += run.seconds
        m.tokens += run.tokens
        m.row_forwards += run.row_forwards
        for out in run.outputs:
            m.steps += len(out.steps)
            m.latencies += [r.seconds for r in out.results]  # each request's own measured finish time
            L = out.prompt_len + cfg.gen_length
            m.predicted_seconds += sum(roof.step(s.rows * s.positions, L, s.rows) for s in out.steps)
            m.positions += sum(s.rows * s.positions for s in out.steps)
    m.peak_rss_mib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    return m


def with_ar_twin(grid: list[BenchConfig], dflash: bool = False) -> list[BenchConfig]:
    """The grid plus the AR twin at each of its batch sizes (and, with `dflash`, the AR twin
    verifying its DFlash drafter's blocks)."""
    g = grid[0].gen_length
    batches = sorted({c.batch for c in grid})
    twins = [BenchConfig("ar", 1.0, "kv", None, g, g, b) for b in batches]
    if dflash:
        twins += [BenchConfig("dflash", 1.0, "kv", None, g, g, b) for b in batches]
    return list(grid) + sorted(twins, key=lambda c: c.batch)


def context(device=None) -> dict:
    cpu = platform.processor()
    try:
        cpu = next(line.split(":", 1)[1].strip() for line in open("/proc/cpuinfo") if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    try:
        commit = subprocess.run(["git", "rev-parse", "HEAD"], capture_output=True, text=True, timeout=5).stdout.strip()
    except OSError:
        commit = None
    gpu = torch.cuda.get_device_name(device) if device is not None and torch.device(device).type == "cuda" else None
    return {"cpu": cpu, "gpu": gpu, "cores": os.cpu_count(), "threads": torch.get_num_threads(), "torch": torch.__version__,
            "python": platform.python_version(), "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
            "commit": commit or None, "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "timer_includes": TIMER_INCLUDES}


def run_grid(diffusion: LLM, ar: LLM | None, grid: list[BenchConfig], tasks: list[str], n: int,
             progress=None, on_examples=None, block: LLM | None = None, split: str = "selection",
             chosen: dict | None = None) -> dict:
    """Measure every configuration (and the AR twin at each batch size). `progress(i, total, run)`
    after each configuration, with the run so far (its last row just measured), `on_examples(k)`
    after each decoded batch of k examples. Configurations of model "block" run on `block` (a
    block-diffusion model), on the same examples: the first `n` of each task's held-out `split`.
    `chosen` (see unmask.bench.report.chosen_from): the selection run whose picks this run reports."""
    device = next(diffusion.model.parameters()).device
    hw = for_device(device)
    roofs = {"diffusion": (diffusion, _roofline(diffusion, hw))}
    if ar is not None:
        roofs["ar"] = (ar, _roofline(ar, hw))
    if block is not None:
        roofs["block"] = (block, _roofline(block, hw))
    dflash = ar is not None and getattr(ar, "drafter", None) is not None
    if dflash:  # the AR twin alone, then verifying its drafter's blocks
        roofs["dflash"] = (ar, roofs["ar"][1])
        roofs["ar"] = (ar.without_draft(), roofs["ar"][1])
    rows, baselines = [], {}
    configs = with_ar_twin(grid, dflash) if ar is not None else list(grid)
    d = diffusion.default_params()  # what the code's defaults are as this run measures them
    run = {"context": {**context(device), "device": str(device), "data_parallel": getattr(diffusion, "n", 1),
                       "linear_kernel": getattr(diffusion, "linear_kernel", None),
                       "defaults": {"policy": d.policy, "knob": d.threshold if d.policy == "threshold" else None,
                                    "cache": d.cache, "block_length": d.block_length, "gen_length": d.gen_length}},
           "hardware_measured": hw.__dict__,
           "tasks": tasks, "n_per_task": n, "split": split,
           "examples": f"held-out examples {SPLITS[split][0]}-{SPLITS[split][0] + n - 1} of each task",
           "dtype": str(next(diffusion.model.parameters()).dtype).replace("torch.", ""),
           "model": str(diffusion.path), "ar_model": str(ar.path) if ar else None,
           "draft_model": str(ar.draft_path) if dflash else None,
           "block_model": str(block.path) if block else None,
           "configurations": len(configs), "results": rows}
    if chosen is not None:
        run["chosen"] = chosen
    for i, cfg in enumerate(configs):
        llm, roof = roofs[cfg.policy if cfg.policy in ("ar", "dflash") else cfg.model]
        m = measure(llm, cfg, tasks, n, roof, on_examples, split)
        baselines.setdefault(cfg.batch, m if cfg.policy not in ("ar", "dflash") else None)
        base = baselines.get(cfg.batch) or next(iter(baselines.values()))
        rows.append(m.summary(base))
        if progress:
            progress(i + 1, len(configs), run)
    return run
