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

Why numba: finding record boundaries is inherently sequential (each record's length is a
varint that must be read before the next record can be found), so numpy alone cannot walk
records without a Python-level loop per record.  numba compiles that one loop; everything
around it (header parsing, varint sizing, null masks, offsets) stays vectorized numpy.
"""

from __future__ import annotations

import importlib.util
import os
import sys
import threading
import types
from pathlib import Path

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
        setattr(mod, fn, numba.njit(cache=True, nogil=True)(getattr(mod, fn)))
    return mod


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
"""The kernels selected by :func:`use`; None: the compiled copy when there is one."""


def active() -> types.ModuleType:
    """The kernels the codec uses now."""
    global _active
    if _active is None:
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
