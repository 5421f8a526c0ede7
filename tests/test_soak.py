"""A long-running engine stays small: requests with ever-changing settings come and go, and every
container the engine keeps returns to empty (a bounded ring for the trace). The full soak with
resident memory (5,000 requests, and 1,000 through `unmask serve`) is benchmarks/soak.py."""

import random
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parents[1] / "benchmarks"))

import pytest  # noqa: E402
from soak import containers, drive  # noqa: E402

from unmask.engine import EngineConfig  # noqa: E402
from unmask.tasks import TASKS, split_examples  # noqa: E402


@pytest.mark.slow
def test_engine_containers_stay_bounded_over_many_requests(embedded):
    prompts = embedded.encode([ex.prompt for t in TASKS for ex in split_examples(t, "selection", 5)], chat=False)
    engine = embedded.engine(EngineConfig(max_num_seqs=8, max_waiting=16, trace_limit=50))
    peak = {}
    for _ in drive(embedded, engine, prompts, 300, random.Random(1), 8):
        sizes = containers(engine)
        assert sizes["settings"] == sizes["parts"] <= sizes["running"]  # only settings rows use are kept
        assert sizes["trace"] <= 50
        peak = {k: max(v, peak.get(k, 0)) for k, v in sizes.items()}
    assert containers(engine) | {"trace": 0} == {k: 0 for k in peak}
    assert peak["records"] <= 8 + 16 + 8  # running, waiting, and finished in the step before release
