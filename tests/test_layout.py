"""Imports point one way (docs/architecture.md): a module imports only from lower layers."""

import ast
from pathlib import Path

import unmask

ROOT = Path(unmask.__file__).parent
# higher imports lower; equal ranks may not import each other
RANK = {"layers": 0, "models": 1, "kv": 2, "tokenizer": 2, "sampler": 2, "cache": 2, "loading": 2, "canvas": 3, "compat": 3, "constrain": 3,
        "params": 4, "inputs": 5, "holes": 5, "engine": 6, "parallel": 6, "reference": 6, "outputs": 6, "infill": 6.5, "checkpoint": 6.5, "llm": 7, "evaluate": 8,
        "bench": 9, "train": 9, "server": 9, "cli": 10}
# import nothing of unmask but errors; anyone may use them
LEAVES = {"errors", "progress", "tasks", "files", "registry", "trace", "cluster", "knobs", "hub"}
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


def _module_graph() -> dict[str, set[str]]:
    """Every import between unmask's modules, function-level ones too (package __init__ files,
    which only re-export, left out)."""
    mods = {}
    for p in ROOT.rglob("*.py"):
        parts = p.relative_to(ROOT.parent).with_suffix("").parts
        mods[".".join(parts[:-1]) if parts[-1] == "__init__" else ".".join(parts)] = p
    graph = {}
    for name, p in mods.items():
        if p.name == "__init__.py":
            continue
        out = set()
        for node in ast.walk(ast.parse(p.read_text())):
            if isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("unmask"):
                for a in node.names:
                    sub = f"{node.module}.{a.name}"
                    out.add(sub if sub in mods else node.module)
            elif isinstance(node, ast.Import):
                out |= {a.name for a in node.names if a.name.startswith("unmask")}
        graph[name] = {m for m in out if m in mods and mods[m].name != "__init__.py" and m != name}
    return graph


def test_no_import_circle():
    """No two modules import each other, directly or through others (lazy imports included)."""
    graph = _module_graph()
    done, path, circles = set(), [], []

    def visit(v):
        path.append(v)
        for w in sorted(graph.get(v, ())):
            if w in path:
                circles.append(path[path.index(w):] + [w])
            elif w not in done:
                visit(w)
        path.pop()
        done.add(v)

    for v in sorted(graph):
        if v not in done:
            visit(v)
    assert not circles, circles[:3]


# the front ends: what a user calls (the Python API, the CLI, the server) and the request checks they share
FRONT_ENDS = ("llm.py", "checkpoint.py", "infill.py", "inputs.py", "holes.py", "outputs.py", "params.py",
              "server", "cli")


def test_front_ends_ask_the_row_kind_not_the_model():
    """No front end reads what kind of model it holds (`arch.kind`, `.causal`) or compares a row
    kind's label: it asks the row kind (engine/kind.py kind_for, Takes, RowKind.accept), so a new
    kind is its file plus its registration (tests/test_row_kinds.py)."""
    bad = []
    for name in FRONT_ENDS:
        paths = [ROOT / name] if name.endswith(".py") else sorted((ROOT / name).rglob("*.py"))
        for path in paths:
            for node in ast.walk(ast.parse(path.read_text())):
                if isinstance(node, ast.Attribute) and node.attr in ("kind", "causal", "canvas_length") and \
                        any(w in ast.unparse(node.value) for w in ("arch", "config")):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} reads {ast.unparse(node)}")
                if isinstance(node, ast.Compare) and any(isinstance(x, ast.Attribute) and x.attr == "label"
                                                         for x in [node.left, *node.comparators]):
                    bad.append(f"{path.relative_to(ROOT)}:{node.lineno} compares {ast.unparse(node)}")
    assert not bad, bad
