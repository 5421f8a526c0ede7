import os
import sys
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).parent))

import pytest  # noqa: E402

from checkpoints import write_dream, write_llada  # noqa: E402


@pytest.fixture(scope="session")
def llada_dir(tmp_path_factory):
    return write_llada(tmp_path_factory.mktemp("llada"))


@pytest.fixture(scope="session")
def dream_dir(tmp_path_factory):
    return write_dream(tmp_path_factory.mktemp("dream"))


@pytest.fixture(scope="session")
def llada(llada_dir):
    from unmask import LLM

    return LLM(llada_dir)


@pytest.fixture(scope="session")
def dream(dream_dir):
    from unmask import LLM

    return LLM(dream_dir)


# the embedded models, loaded once per session (tests that change a model restore it)
@pytest.fixture(scope="session")
def embedded():
    from unmask import LLM

    return LLM()


@pytest.fixture(scope="session")
def embedded_ar():
    from unmask import LLM

    return LLM("default-ar")


@pytest.fixture(scope="session")
def embedded_block():
    from unmask import LLM

    return LLM("default-block")


@pytest.fixture()
def plain_kernel(monkeypatch):
    """Models loaded inside the test stay on PyTorch's F.linear: for comparisons with plain-PyTorch
    references at 1e-5, a bar two GEMM kernels need not meet (oneDNN against F.linear differed by
    1.3e-5 on one CI machine). The kernels' own agreement is tests/test_linear_kernels.py's."""
    monkeypatch.setenv("UNMASK_LINEAR_KERNEL", "default")


@pytest.fixture(scope="session")
def embedded_ar_code():
    """The embedded code model's autoregressive twin (prefix-suffix-middle infilling)."""
    from unmask import LLM

    return LLM("default-code-ar")
