"""Loads the codec's inner loops compiled by numba, or as plain Python.

The loops are in ``_kernels_src`` (entries, records), ``_kernels_enc_src`` (batches written and
rebuilt), ``_kernels_part_src`` (a sink task's rows encoded into every partition in one pass) and
``_kernels_hash_src`` (the cleaner's key hashing and offset map, the partitioner's murmur2); the
files are executed into one module per copy, so a kernel calls any helper of another and callers
find every kernel on :func:`active`.

numba is a declared dependency, so the compiled copy is the normal path.  The plain-Python
copy is the fallback for platforms without numba and for ``PYLOG_NO_JIT=1``; the tests run
both, and the Python copy doubles as a bounds-checked oracle for the compiled one (compiled
code does not check array bounds).

Machine code is compiled once per installation: numba caches it on disk (next to the kernel
sources in ``__pycache__``, in ``NUMBA_CACHE_DIR`` when set, else in a user-wide cache directory
when the package's folder is read-only), ``make`` warms that cache after installing
(``python -m pylog.tools.warm_kernels``), and a process that finds a kernel signature missing
compiles it holding a lock file in the cache directory, so that processes starting together
(Spark's Python workers) compile it once and the others load it.  Even a cached kernel costs a
new process about a second (importing numba and setting up its code generator), as much as the
interpreted copy takes for ~20,000 records: so a process runs its first :data:`PYTHON_BUDGET`
records through the interpreted copy (a CLI command, a driver-side commit scanning a few batch
headers never load numba) and switches to the compiled one for good at the first call that
would exceed it.

Why numba: finding record boundaries is inherently sequential (each record's length is a
varint that must be read before the next record can be found), so numpy alone cannot walk
records without a Python-level loop per record.  numba compiles that one loop; everything
around it (header parsing, varint sizing, null masks, offsets) stays vectorized numpy.
"""

from __future__ import annotations

import contextlib
import importlib.util
import os
import sys
import threading
import types
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

_SOURCES = tuple(
    Path(__file__).with_name(f"_kernels{part}_src.py") for part in ("", "_enc", "_part", "_hash")
)
"""Executed in order into one namespace: the codec's decoding kernels and shared helpers, its
encoding kernels, the partitioned encoder's, then the cleaner's hashing ones."""
KERNELS = (
    "scan_entries",
    "walk_records",
    "decode_headers",
    "gather",
    "plan_batches",
    "write_batches",
    "write_rebuilt",
    "plan_partitioned",  # a sink task's rows into every partition at once (encoding.py)
    "write_partitioned",
    # hashing (cleaner.py, offset_map.py)
    "hash_keys",
    "map_put",
    "map_get",
    "murmur2_keys",  # the default partitioner (partitioner.py)
)
HELPERS = (
    "wrap64",
    "copy_bytes",
    "read_varint",
    "varint_size",
    "write_varint",
    "put_be",
    "get_be",
    "_fail",
    "min_body",
    "write_header",
    "rotl64",
    "fmix64",
    "load_le64",
)


def _load(name: str) -> types.ModuleType:
    """A fresh module ``name`` holding the definitions of every file of ``_SOURCES`` (each
    function keeps its own file name, which numba's on-disk cache is keyed on)."""
    mod: types.ModuleType | None = None
    for path in _SOURCES:
        spec = importlib.util.spec_from_file_location(name, path)
        assert spec is not None and spec.loader is not None
        if mod is None:
            mod = importlib.util.module_from_spec(spec)
            sys.modules[name] = mod
        spec.loader.exec_module(mod)
    assert mod is not None
    return mod


python = _load("pylog.storage._kernels_py")
"""The interpreted copy (fallback and oracle)."""


def _memcpy_intrinsic():  # type: ignore[no-untyped-def]
    """``copy_bytes(dst, doff, src, soff, n)`` as an inlined LLVM memcpy (cacheable, unlike a
    ctypes call; about 4x faster than numba's slice assignment for 100-byte values)."""
    from numba.core import cgutils
    from numba.core import types as nt
    from numba.extending import intrinsic

    @intrinsic
    def copy_bytes(typingctx, dst, doff, src, soff, n):  # type: ignore[no-untyped-def]
        sig = nt.void(dst, doff, src, soff, n)

        def codegen(context, builder, signature, args):  # type: ignore[no-untyped-def]
            d, do, s, so, nn = args
            dptr = builder.gep(context.make_array(signature.args[0])(context, builder, d).data, [do])
            sptr = builder.gep(context.make_array(signature.args[2])(context, builder, s).data, [so])
            cgutils.raw_memcpy(builder, dptr, sptr, nn, context.get_constant(nt.intp, 1))
            return context.get_dummy_value()

        return sig, codegen

    return copy_bytes


def _compile() -> types.ModuleType | None:
    try:
        import numba
    except ImportError:  # pragma: no cover - numba is a dependency; fallback kept working
        return None
    mod = _load("pylog.storage._kernels_jit")

    def _identity(x):  # type: ignore[no-untyped-def]
        return x

    setattr(mod, "wrap64", numba.njit(cache=True)(_identity))  # noqa: B010
    setattr(mod, "copy_bytes", _memcpy_intrinsic())  # noqa: B010
    for fn in HELPERS[2:]:  # inlined into the kernels at numba's level: no call per varint
        setattr(mod, fn, numba.njit(cache=True, nogil=True, inline="always")(getattr(mod, fn)))
    for fn in KERNELS:
        kernel = numba.njit(cache=True, nogil=True)(getattr(mod, fn))
        setattr(kernel, "compile", _locked(kernel, kernel.compile))  # noqa: B010 (what the dispatcher calls)
        setattr(mod, fn, kernel)
    return mod


LOCK_NAME = "pylog-kernels.lock"
"""The lock file, in numba's cache directory, held while a signature is loaded or compiled."""
_lock_depth = 0
_rlock = threading.RLock()


@contextlib.contextmanager
def _cache_lock(cache_dir: str | None) -> Iterator[None]:
    """Hold the cache directory's lock file (reentrant within the process; no lock where the
    directory cannot hold one or ``fcntl`` is missing: numba's own cache writes stay atomic)."""
    global _lock_depth
    with _rlock:
        fd = -1
        if _lock_depth == 0 and cache_dir:
            try:
                import fcntl

                os.makedirs(cache_dir, exist_ok=True)
                fd = os.open(os.path.join(cache_dir, LOCK_NAME), os.O_RDWR | os.O_CREAT, 0o666)
                fcntl.flock(fd, fcntl.LOCK_EX)
            except (ImportError, OSError):
                if fd >= 0:
                    os.close(fd)
                fd = -1
        _lock_depth += 1
        try:
            yield
        finally:
            _lock_depth -= 1
            if fd >= 0:
                os.close(fd)  # releases the flock


def _locked(kernel: Any, compile_sig: Callable[[Any], Any]) -> Callable[[Any], Any]:
    """``kernel.compile`` that loads or compiles a signature this process lacks under the
    cache's lock: a process waiting for another's compilation then loads its result."""
    from numba.core import sigutils

    cache_dir = getattr(getattr(kernel, "_cache", None), "_cache_path", None)

    def compile(sig: Any) -> Any:
        args, _ = sigutils.normalize_signature(sig)
        if kernel.overloads.get(tuple(args)) is not None:
            return compile_sig(sig)
        with _cache_lock(cache_dir):
            return compile_sig(sig)

    return compile


_jit: types.ModuleType | None = None
_jit_loaded = False
_jit_lock = threading.Lock()


def compiled() -> types.ModuleType | None:
    """The numba-compiled copy, or None when numba is missing or ``PYLOG_NO_JIT`` is set.

    numba is imported, and the kernels' cached machine code loaded, on the first call (from
    :func:`active`, when a batch is first encoded or decoded), not at import: a process that
    never touches a record batch, like Spark's driver-side processes that plan a read or
    commit a write, saves about half a second of CPU at each query start."""
    global _jit, _jit_loaded
    if not _jit_loaded:
        with _jit_lock:
            if not _jit_loaded:
                _jit = None if os.environ.get("PYLOG_NO_JIT") else _compile()
                _jit_loaded = True
    return _jit


_active: types.ModuleType | None = None
"""The kernels selected by :func:`use`, or chosen once the interpreted budget is spent; None:
the choice is still open (see :func:`active`)."""

PYTHON_BUDGET = 20_000
"""Records (or log entries) a process runs through the interpreted kernels before loading the
compiled ones: about what loading numba costs a new process (~1 s)."""
_python_work = 0


def active(work: int | None = None) -> types.ModuleType:
    """The kernels for a call about to do ``work`` steps (records encoded or walked, entries
    scanned; None: unknown, treated as large).  Until the process has loaded numba, calls that
    fit in what is left of :data:`PYTHON_BUDGET` get the interpreted copy; the first one that
    does not (or gives no ``work``) loads the compiled copy, which every later call gets."""
    global _active, _python_work
    if _active is None:
        if work is not None and _python_work + work <= PYTHON_BUDGET and not _jit_loaded:
            _python_work += work
            return python
        _active = compiled() or python
    return _active


def use(kind: str) -> types.ModuleType | None:
    """Select ``"jit"`` or ``"python"`` kernels process-wide; returns the previous selection
    for :func:`restore` (None: the default, not compiled yet if nothing used it)."""
    global _active
    previous = _active
    if kind == "python":
        _active = python
    elif kind == "jit":
        jit = compiled()
        if jit is None:
            raise RuntimeError("numba kernels are unavailable (numba missing or PYLOG_NO_JIT)")
        _active = jit
    else:
        raise ValueError(f"unknown kernel kind {kind!r}; expected 'jit' or 'python'")
    return previous


def restore(previous: types.ModuleType | None) -> None:
    global _active
    _active = previous
