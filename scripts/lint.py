"""Type and import-contract checks of the whole package, as installed (``make lint``).

pyproject.toml maps the folders ``storage/`` and ``connector/`` into the package
(``pylog.storage``, ``pylog.connector``).  Neither mypy nor import-linter follows that mapping:
run on the folders, mypy would see a top-level package ``storage`` and resolve every
``from pylog.storage ...`` import to nothing.  So this script lays out the package as it is
installed — ``build/lint/pylog/{storage,connector}/...``, real directories of symlinks to the
source files, rebuilt on every run so new and deleted modules are always seen — and runs

1. ``mypy -p pylog`` over it (every module, real cross-module types; paths in its messages are
   mapped back to the source files), and
2. ``lint-imports`` (the layer contracts in pyproject.toml, see docs/architecture.md) with that
   tree first on the import path.

Exit status: non-zero when either check fails.  ``--root DIR`` checks another checkout (the
tests use it to plant errors in a copy).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
from pathlib import Path

# package -> folder of the checkout, as [tool.setuptools] package-dir maps them
MAPPING = {"pylog": "pylog", "pylog/storage": "storage", "pylog/connector": "connector"}


def build_tree(root: Path, out: Path) -> dict[str, str]:
    """Mirror the installed package layout under ``out`` with symlinks; returns the prefix map
    (path in the tree -> path in the checkout) used to translate messages back."""
    if out.exists():
        shutil.rmtree(out)
    prefixes: dict[str, str] = {}
    for pkg, folder in MAPPING.items():
        src = root / folder
        for dirpath, dirnames, filenames in os.walk(src):
            rel = Path(dirpath).relative_to(src)
            # a mapped sub-folder (pylog/storage) is not inside pylog/ in the checkout; skip caches
            dirnames[:] = [d for d in dirnames if d != "__pycache__" and not d.startswith(".")]
            target = out / pkg / rel
            target.mkdir(parents=True, exist_ok=True)
            for name in filenames:
                if name.endswith((".py", ".pyi", ".typed")):
                    (target / name).symlink_to((Path(dirpath) / name).resolve())
        prefixes[f"{pkg}/"] = f"{folder}/"
    return prefixes


def run(cmd: list[str], *, cwd: Path, env: dict[str, str], prefixes: dict[str, str]) -> int:
    proc = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True)
    text = "\n" + proc.stdout + proc.stderr
    # longest prefix first: pylog/storage/ before pylog/
    for tree, source in sorted(prefixes.items(), key=lambda kv: -len(kv[0])):
        text = text.replace(f"\n{tree}", f"\n{source}")
    text = text[1:]
    sys.stdout.write(text)
    return proc.returncode


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--root", type=Path, default=Path(__file__).resolve().parent.parent)
    args = ap.parse_args(argv)
    root: Path = args.root.resolve()
    tree = root / "build" / "lint"
    prefixes = build_tree(root, tree)
    bindir = Path(sys.executable).parent
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tree), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["MYPYPATH"] = str(tree)
    status = 0
    print("mypy -p pylog (storage, connector, pylog)", flush=True)
    status |= run(
        [
            str(bindir / "mypy"),
            "--config-file",
            str(root / "pyproject.toml"),
            "--cache-dir",
            str(root / "build" / "mypy-cache"),
            "-p",
            "pylog",
        ],
        cwd=tree,
        env=env,
        prefixes=prefixes,
    )
    print("lint-imports (layer contracts)", flush=True)
    # the contracts in pyproject.toml, found where lint-imports looks when given no config file
    # (its --config option is deprecated, a positional config file is not taken by every version)
    (tree / "pyproject.toml").unlink(missing_ok=True)  # a concurrent run may have made it
    (tree / "pyproject.toml").symlink_to(root / "pyproject.toml")
    status |= run(
        [str(bindir / "lint-imports"), "--no-cache"],
        cwd=tree,
        env=env,
        prefixes=prefixes,
    )
    return 1 if status else 0


if __name__ == "__main__":
    sys.exit(main())
