"""What a model accepts: the one function from (generation parameters, architecture) to the
parameters the model runs, checked, or an UnmaskError that names what it cannot take.

The Python API, the CLI, the server and the engine all go through `accept`; the results are
memoised, so a request that passes several of them is checked once. The rules are the row
kind's (engine/kind.py RowKind.accept: a masked kind's blocks, caches and the autoregressive
twin's few knobs in engine/masked.py, a renoising sampler's in engine/renoise.py): this module
asks the kind the model decodes with and never looks at the model's kind itself. Reference
modes (`compat`) are checked here too; only `LLM.generate` runs them (unmask.reference).
"""

from collections.abc import Iterable
from functools import lru_cache

from unmask.engine.kind import ROW_KINDS, kind_for
from unmask.errors import UnmaskError
from unmask.models.base import ArchConfig
from unmask.params import GenerationParams


def accept(params: GenerationParams, arch: ArchConfig, given: Iterable[str] | None = None,
           engine: bool = False) -> GenerationParams:
    """`given`: the fields the caller set explicitly (CLI flags, request fields); without it, the
    fields that differ from the reference setting (the canvas shape aside). `engine`: the request
    engine runs it (a reference mode is refused)."""
    if not isinstance(params, GenerationParams):
        raise UnmaskError(f"params must be a GenerationParams or a dict of its fields, not {type(params).__name__}")
    return _accept(params, arch, None if given is None else frozenset(given), engine)


@lru_cache(maxsize=1024)
def _accept(params: GenerationParams, arch: ArchConfig, given: frozenset | None, engine: bool) -> GenerationParams:
    return ROW_KINDS.lookup(kind_for(arch), UnmaskError).accept(params, arch, given, engine)


def screen(given: dict, arch: ArchConfig) -> dict:
    """The fields a caller gave, screened by the model's row kind before its defaults fill them in
    (RowKind.screen: refused by name early, or completed where its sampler fixes a field)."""
    return ROW_KINDS.lookup(kind_for(arch), UnmaskError).screen(given, arch)
