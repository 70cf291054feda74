from __future__ import annotations

from collections.abc import Iterator

import pytest

from pylog.storage.codec import _kernels


@pytest.fixture(params=["jit", "python"])
def kernels(request: pytest.FixtureRequest) -> Iterator[str]:
    """Run a test with the numba-compiled kernels and with the pure-Python fallback."""
    if request.param == "jit" and _kernels.compiled() is None:
        pytest.skip("numba is not available (PYLOG_NO_JIT set or numba missing)")
    previous = _kernels.use(request.param)
    try:
        yield request.param
    finally:
        _kernels.restore(previous)
