"""Coverage-guided fuzzing of the targets of :mod:`fuzz_targets` with atheris (libFuzzer).

    python -m tests.reliability.fuzz_atheris TARGET [libFuzzer flags, e.g. -max_total_time=60]

pylog's Python modules are instrumented for coverage (the numba-compiled kernels run
compiled, as in production; their pure-Python copy is fuzzed with ``PYLOG_NO_JIT=1``).  An
input that makes the oracle fail is written to ``-artifact_prefix`` and the process exits
non-zero.  :func:`run_atheris` runs one target in a subprocess and returns (exit code,
executions, output); it returns None when atheris is not installed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def available() -> bool:
    try:
        import atheris  # noqa: F401
    except ImportError:
        return False
    return True


def run_atheris(
    target: str, seconds: float, *, seed: int = 1, rss_limit_mb: int = 2048, no_jit: bool = False
) -> tuple[int, int, str] | None:
    if not available():
        return None
    with tempfile.TemporaryDirectory() as tmp:
        corpus = Path(tmp) / "corpus"
        corpus.mkdir()
        from tests.reliability.fuzz_targets import seeds

        for i, s in enumerate(seeds(target)):
            (corpus / f"seed-{i}").write_bytes(s)
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")]))
        if no_jit:
            env["PYLOG_NO_JIT"] = "1"
        cmd = [
            sys.executable,
            "-m",
            "tests.reliability.fuzz_atheris",
            target,
            f"-max_total_time={max(1, int(seconds))}",
            f"-seed={seed}",
            f"-rss_limit_mb={rss_limit_mb}",
            "-timeout=10",
            "-max_len=8192",
            f"-artifact_prefix={tmp}/",
            str(corpus),
        ]
        proc = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=seconds + 120)
        out = proc.stdout + proc.stderr
        m = re.search(r"Done (\d+) runs", out)
        runs = int(m.group(1)) if m else max((int(x) for x in re.findall(r"#(\d+)\s", out)), default=0)
        return proc.returncode, runs, out


def main() -> None:
    import atheris

    target = sys.argv[1]
    with atheris.instrument_imports(include=["pylog"], exclude=["pylog.storage.codec._kernels"]):
        from tests.reliability import fuzz_targets

    def one_input(data: bytes) -> None:
        fuzz_targets.run_one(target, data, max_seconds=10.0)

    atheris.Setup([sys.argv[0], *sys.argv[2:]], one_input)
    atheris.Fuzz()


if __name__ == "__main__":
    main()
