"""Imports point one way (docs/architecture.md): a module imports only from lower layers."""

import ast
from pathlib import Path

import unmask

ROOT = Path(unmask.__file__).parent
# higher imports lower; equal ranks may not import each other
RANK = {"layers": 0, "models": 1, "kv": 2, "tokenizer": 2, "sampler": 2, "cache": 2, "loading": 2, "canvas": 3, "compat": 3,
        "params": 4, "accept": 5, "inputs": 5, "engine": 6, "parallel": 6, "reference": 6, "outputs": 6, "llm": 7, "evaluate": 8,
        "bench": 9, "train": 9, "server": 9, "cli": 10}
# import nothing of unmask but errors; anyone may use them
LEAVES = {"errors", "progress", "tasks", "files", "registry", "trace", "cluster"}
# no unit is split across ranks (the compat modes' registry, below params, is its own module)
SUBUNITS: set[str] = set()


def _unit(path: Path) -> str:
    parts = path.relative_to(ROOT).with_suffix("").parts
    return ".".join(parts[:2]) if ".".join(parts[:2]) in SUBUNITS else parts[0]


def _imports(path: Path) -> set[str]:
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        names = [node.module] if isinstance(node, ast.ImportFrom) and node.module else \
            [a.name for a in node.names] if isinstance(node, ast.Import) else []
        for n in names:
            if n.startswith("unmask."):
                sub = ".".join(n.split(".")[1:3])
                out.add(sub if sub in SUBUNITS else n.split(".")[1])
    return out


def test_imports_point_one_way():
    bad = []
    for path in ROOT.rglob("*.py"):
        unit = _unit(path)
        if unit in ("__init__", "__main__"):
            continue
        for target in _imports(path) - {unit}:
            if unit in LEAVES:
                ok = target == "errors"
            else:
                ok = target in LEAVES or RANK[target] < RANK[unit]
            if not ok:
                bad.append(f"{path.relative_to(ROOT)} imports unmask.{target}")
    assert not bad, bad


def test_every_unit_has_a_rank():
    units = {_unit(p) for p in ROOT.rglob("*.py")} - {"__init__", "__main__"}
    assert units <= set(RANK) | LEAVES, units - set(RANK) - LEAVES
