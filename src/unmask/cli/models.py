"""`unmask models`: the embedded models and the checkpoint layouts `--model` reads, from the same
tables the loader uses (unmask.loading.EMBEDDED_ABOUT, unmask.models.registry.FAMILIES)."""

import argparse
import json

from unmask.loading import EMBEDDED_ABOUT
from unmask.models.dflash import ARCHITECTURES as DFLASH_ARCHITECTURES
from unmask.models.registry import FAMILIES, layouts

DRAFT_LAYOUT = ("DFlash drafter (z-lab/Qwen3-*-DFlash-*): drafts for a Qwen3 or AR target; given with --draft, "
                "not --model")


def model_help() -> str:
    """--model's help text, generated from the tables `unmask models` prints."""
    names = ", ".join(fam.layout.split(" (")[0] for fam in FAMILIES)
    embedded = ", ".join(n for n in EMBEDDED_ABOUT if n != "default-dflash")
    return (f"an embedded model ({embedded}; default: default), a local Hugging Face checkpoint folder, or a Hub "
            f"name (org/name or org/name@revision, downloaded into the Hub cache), in a released layout ({names}); "
            "or a GGUF file of LLaDA, Dream or LLaDA-MoE (file.gguf, or org/name:TAG on the Hub); `unmask models` "
            "lists them")


def cmd_models(a: argparse.Namespace) -> int:
    rows = {"embedded": [{"name": n, "about": t} for n, t in EMBEDDED_ABOUT.items()],
            "layouts": [{"config": c, "layout": t} for c, t in layouts()]
            + [{"config": f"architectures {DFLASH_ARCHITECTURES[0]!r}", "layout": DRAFT_LAYOUT}]}
    if a.json:
        print(json.dumps(rows))
        return 0
    width = max(len(r["name"]) for r in rows["embedded"])
    print("Embedded models (shipped with the package; --model NAME):")
    for r in rows["embedded"]:
        print(f"  {r['name']:<{width}}  {r['about']}")
    print("\nCheckpoint layouts (--model /path/to/folder or a Hub name, org/name[@revision]: config.json, safetensors, "
          "tokenizer; no remote code):")
    for r in rows["layouts"]:
        print(f"  {r['layout']}\n      config.json: {r['config']}")
    return 0


def add_parsers(sub) -> dict:
    """Add this module's commands to the subparsers; returns {name: function}."""
    m = sub.add_parser("models", help="list the embedded models and the checkpoint layouts --model reads")
    m.add_argument("--json", action="store_true", help="print one JSON object")
    return {"models": cmd_models}
