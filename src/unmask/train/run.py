"""The training loop: progress bar, periodic held-out accuracy, checkpoint and resume."""

import json
import shutil
import sys
import time
from dataclasses import asdict
from pathlib import Path

import torch

from unmask.errors import UnmaskError
from unmask.files import output_folder, writable_folder
from unmask.loading import resolve_model_path
from unmask.models.llada import LLaDAModel
from unmask.models.loader import load_drafter, load_model
from unmask.progress import Progress
from unmask.train import dflash, renoise
from unmask.train.data import EXPAND, TaskSampler, build_tokenizer, make_batches
from unmask.train.trainer import TrainConfig, arch_for, lr_at, save_model, token_ids, train_step

STATE = "trainer_state.pt"


def _code_eval(model, cfg: TrainConfig, held: list, mask_id: int) -> dict[str, float]:
    """A code model's mean loss on fixed rows of the selection split (the diffusion loss at noise
    levels spread evenly over (eps, 1), the same draws every time; the AR twin's next-token loss)."""
    from unmask.train.trainer import ar_loss, ar_targets, diffusion_loss

    model.eval()
    with torch.no_grad():
        gen = torch.Generator().manual_seed(0)
        if cfg.kind == "ar":
            loss = sum(float(ar_loss(model, b)) for b in held) / sum(ar_targets(b) for b in held)
        else:
            total = 0.0
            for b in held:
                n = b.ids.shape[0]
                t = cfg.eps + (1 - cfg.eps) * (torch.arange(n) + 0.5) / n
                total += float(diffusion_loss(model, b, mask_id, t, gen))
            loss = total / sum(b.ids.shape[0] * (b.ids.shape[1] - 1) for b in held)
    model.train()
    return {"select_loss": round(loss, 4)}


def _grown(src: dict, own: dict, mask_id: int) -> dict:
    """`src`'s weights for a model whose vocabulary has tokens added at its end (the expand token):
    a new token's embedding starts as the mask's, its output row at zero; every other tensor must
    match (load_state_dict says which does not)."""
    out = dict(src)
    for name in ("model.transformer.wte.weight", "model.transformer.ff_out.weight"):
        a, b = src.get(name), own.get(name)
        if a is None or b is None or a.shape[0] >= b.shape[0] or a.shape[1:] != b.shape[1:]:
            continue
        extra = (a[mask_id : mask_id + 1] if name.endswith("wte.weight") else torch.zeros_like(a[:1]))
        out[name] = torch.cat([a, extra.expand(b.shape[0] - a.shape[0], -1)])
    return out


def _eval(model, tok, cfg: TrainConfig) -> dict[str, float]:
    from unmask.evaluate import evaluate
    from unmask.llm import LLM
    from unmask.params import GenerationParams
    from unmask.tokenizer import Tokenizer

    if cfg.kind == "dflash":  # acceptance and losslessness of speculative decoding with the target
        return dflash.evaluate(model, tok, tuple(sorted(cfg.tasks)), cfg.eval_n, cfg.gen_length, token_ids(tok).stop)
    llm = LLM.from_parts(model, Tokenizer(tok, {}, None), token_ids(tok))
    g = cfg.gen_length
    block = cfg.block_length if cfg.kind == "block" else g
    if cfg.kind == "renoise":  # its own sampler, at most one step per canvas position, seeded
        params = GenerationParams(gen_length=g, block_length=g, max_denoising_steps=g, seed=0)
    else:
        params = GenerationParams(gen_length=g, block_length=block, steps=g)  # one token per step
    model.eval()
    res = evaluate(llm, tuple(sorted(cfg.tasks)), cfg.eval_n, params, batch_size=cfg.eval_n)
    model.train()
    return {r.task: round(r.exact, 4) for r in res}


def _target(cfg: TrainConfig, tok):
    """The drafter's frozen target (an autoregressive model over the task suite's vocabulary)."""
    from unmask.llm import LLM

    llm = LLM(cfg.target, linear_kernel="default")  # gradients flow through its head into the drafter
    if not llm.arch.causal:
        raise UnmaskError(f"--target {cfg.target}: a drafter's target must be an autoregressive model; "
                          f"this one is a {llm.arch.family} diffusion model")
    if llm.arch.vocab_size != tok.get_vocab_size():
        raise UnmaskError(f"--target {cfg.target}: its vocabulary ({llm.arch.vocab_size}) is not the task "
                          f"suite's ({tok.get_vocab_size()})")
    bad = [i for i in cfg.target_layers if i >= llm.arch.num_layers]
    if bad:
        raise UnmaskError(f"target_layers {bad} are not layers of the {llm.arch.num_layers}-layer target")
    llm.model.requires_grad_(False)
    return llm


def _prepare_out(out: Path, resume: bool, overwrite: bool) -> bool:
    """Check that `out` may be written: a new or empty folder, our own run to resume, or anything
    with `overwrite`. Returns whether the folder is new (and so may be removed if the start fails)."""
    output_folder(out, "--out")  # a file, a path inside a file, or a place where nothing can be made
    holds_run = (out / STATE).exists()
    if resume:
        if not holds_run:
            raise UnmaskError(f"--resume: no {STATE} in {out}")
        return False
    if holds_run and not overwrite:
        raise UnmaskError(f"{out} already holds a run; pass --resume to continue it, --overwrite to replace it, "
                          "or choose another folder")
    if out.is_dir() and any(out.iterdir()) and not holds_run and not overwrite:
        raise UnmaskError(f"{out} is not empty and holds no unmask run; choose another folder or pass --overwrite")
    return not out.exists()


def train(cfg: TrainConfig, out: str | Path, resume: bool = False, progress: bool = True,
          until: int | None = None, overwrite: bool = False) -> dict:
    """Train into run folder `out`; returns the final summary. With `resume`, continue from
    out/trainer_state.pt (the configuration stored there wins, except `steps`, which may grow).
    With `until`, stop after that step with a checkpoint (the learning-rate schedule still spans
    `steps`): a run split into parts this way equals the uninterrupted run."""
    out = Path(out)
    if until is not None and (not isinstance(until, int) or until < 1):
        raise UnmaskError(f"until {until!r} must be a positive step number")
    state_path = out / STATE
    new_folder = _prepare_out(out, resume, overwrite)
    if resume:
        saved = torch.load(state_path, weights_only=False)
        steps = cfg.steps
        cfg = TrainConfig(**saved["config"])
        cfg.steps = max(steps, cfg.steps)
    cfg.check()
    try:
        return _train(cfg, out, resume, saved if resume else None, progress, until)
    except BaseException:
        if new_folder and out.exists() and not state_path.exists():  # a failed start leaves nothing behind
            shutil.rmtree(out, ignore_errors=True)
        raise


def _train(cfg: TrainConfig, out: Path, resume: bool, saved: dict | None, progress: bool, until: int | None) -> dict:
    state_path = out / STATE
    torch.manual_seed(cfg.seed)
    rows = held = None
    if cfg.corpus is not None:  # a code model: rows from the corpus, its own byte-level BPE
        from unmask.train import code

        root = None if cfg.corpus == "stdlib" else cfg.corpus
        folder = code.prepare(out / "corpus", root, cfg.vocab_size)
        rows, tok = code.load_rows(folder, root, "train", cfg.gen_length, cfg.seed, cfg.fim_rate)
        select, _ = code.load_rows(folder, root, "select", cfg.gen_length, 1234, cfg.fim_rate)
        held = [select.batch(min(cfg.eval_n, 16)) for _ in range(max(1, cfg.eval_n // 16))]
    else:
        tok = build_tokenizer()
    if cfg.span_expand:  # DreamOn's expand token, the vocabulary's last id
        tok.add_special_tokens([EXPAND])
    target_llm = None
    if cfg.kind == "dflash":
        target_llm = _target(cfg, tok)
        model = dflash.build(cfg, target_llm.model, tok.token_to_id("<|mdm_mask|>"))
    elif cfg.kind == "renoise":
        model = renoise.build(cfg, tok.get_vocab_size(), token_ids(tok))
    else:
        model = LLaDAModel(arch_for(cfg, tok.get_vocab_size())).train()
        with torch.no_grad():  # LLaDA-style small init
            for name, p in model.named_parameters():
                if p.dim() == 2:
                    p.normal_(0, 0.02)
    if cfg.init_from is not None and not resume:
        init = resolve_model_path(cfg.init_from)  # a run folder, a model folder, or an embedded model's name
        init = init / "model" if (init / "model").exists() else init
        src, _ = (load_drafter(init, linear_kernel="default") if cfg.kind == "dflash"
                  else load_model(init, linear_kernel="default"))
        try:
            if cfg.kind == "dflash":
                model.drafter.load_state_dict(src.state_dict())
            elif cfg.kind == "renoise":
                renoise.init_from_llada(model, src)
            else:
                model.load_state_dict(_grown(src.state_dict(), model.state_dict(), tok.token_to_id("<|mdm_mask|>")))
        except RuntimeError:
            raise UnmaskError(f"--init-from {cfg.init_from}: its weights do not fit this model's size "
                              f"(layers {cfg.layers}, d_model {cfg.d_model}, heads {cfg.heads}, mlp {cfg.mlp})") from None
    writable_folder(out, "run folder")  # only once everything that can be checked has been
    opt = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=(0.9, 0.98), weight_decay=cfg.weight_decay)
    sampler = rows if rows is not None else TaskSampler(cfg.tasks, cfg.seed)
    gen = torch.Generator().manual_seed(cfg.seed + 1)
    step, history, elapsed = 0, [], 0.0
    if resume:
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        sampler.set_state(saved["sampler"])
        gen.set_state(saved["generator"])
        step, history, elapsed = saved["step"], saved["history"], saved["elapsed"]
    mask_id, eos_id = tok.token_to_id("<|mdm_mask|>"), tok.token_to_id("<|endoftext|>")
    expand_id = tok.token_to_id(EXPAND)
    newline = tok.encode("\n", add_special_tokens=False).ids if rows is not None else []
    line_id = newline[0] if len(newline) == 1 else None  # a code model's holes of whole lines
    t0 = time.time()
    smooth = saved.get("smooth") if resume else None  # the logged loss is smoothed across parts too

    def checkpoint(final: bool = False) -> None:
        meta = {"config": asdict(cfg), "step": step, "elapsed_seconds": elapsed + time.time() - t0,
                "history": history, "final": final}
        if rows is not None:
            meta["corpus"] = json.loads((out / "corpus" / "corpus.json").read_text())
        g = cfg.gen_length
        block = cfg.block_length if cfg.kind == "block" else g
        if cfg.kind == "dflash":
            dflash.save(model, tok, out / "model", meta, tok.get_vocab_size())
        elif cfg.kind == "renoise":
            renoise.save(model, tok, out / "model", cfg, token_ids(tok), meta)
        else:
            defaults = {"gen_length": g, "block_length": block, "steps": g}
            if cfg.span_expand:  # its holes grow and shrink by default (DreamOn)
                defaults["hole_length"] = "grow"
            save_model(model, tok, out / "model", defaults, meta)
        torch.save({"config": asdict(cfg), "model": model.state_dict(), "optimizer": opt.state_dict(),
                    "sampler": sampler.state(), "generator": gen.get_state(), "step": step,
                    "history": history, "elapsed": elapsed + time.time() - t0, "smooth": smooth}, out / (STATE + ".tmp"))
        (out / (STATE + ".tmp")).replace(state_path)

    stop = cfg.steps if until is None else min(until, cfg.steps)
    bar = Progress(cfg.steps, enabled=progress, start=step)
    while step < stop:
        for group in opt.param_groups:
            group["lr"] = lr_at(cfg, step)
        if rows is not None:
            batches = [rows.batch(cfg.batch)]
        else:
            examples = [sampler.next() for _ in range(cfg.batch)]
            if target_llm is not None:  # a drafter learns what its target says
                batches = dflash.regenerate(target_llm, examples, tok, cfg.gen_length)
            else:
                batches = make_batches(examples, tok, cfg.gen_length)
        opt.zero_grad(set_to_none=True)
        loss = train_step(model, batches, cfg, mask_id, gen, eos_id, expand_id, line_id)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip)
        opt.step()
        step += 1
        smooth = loss if smooth is None else 0.98 * smooth + 0.02 * loss
        record = {"step": step, "loss": round(smooth, 5), "seconds": round(elapsed + time.time() - t0, 1)}
        if step % cfg.eval_every == 0 or step == cfg.steps:
            record["held_out_exact" if rows is None else "held_out"] = (
                _eval(model, tok, cfg) if rows is None else _code_eval(model, cfg, held, mask_id))
            history.append(record)
            checkpoint(final=step == cfg.steps)
            if progress:
                sys.stderr.write("\n" + json.dumps(record) + "\n")
        else:
            if step % 50 == 0:
                history.append(record)
            if step == stop:
                checkpoint()
        bar.update(1, f"loss {smooth:.4f}")
    bar.close()
    return {"steps": step, "loss": smooth, "history": history[-1] if history else None}
