"""A child's start: its CPU priority lowered before anything else, and where no bytecode is written, its
imports' sources compiled in parallel first.

Every child starts as this script, so its priority is lowered (:data:`LOWER_BY_VARIABLE`, set by the run)
before it imports torch: a standby's imports, seconds of one core's work beside the first training steps,
ran at the run's own priority before (the payload lowered it only once it came).

Where the run's environment writes no bytecode and torch came without it (the H200's host:
``PYTHONDONTWRITEBYTECODE=1``, no ``.pyc`` in torch), every interpreter compiles torch's sources again as
it imports them, one after another: a child's imports took 14-25 s there from the sources against 7.5-10.7 s
reading bytecode (2026-12-03), and a fit's first child on a fresh machine found none to read
(:func:`compile_callback.background.bytecode_env` sets its folder). So where that folder lacks torch's, the
child is started as this script: it compiles the sources the run has imported, and the packages a compile
imports later (Dynamo, AOTAutograd, Inductor, FX, sympy, Triton), into the folder with
:data:`WORKERS` processes forked from this small interpreter, then runs the child
(``compile_callback.background``), whose imports read that bytecode.

Imports only the standard library: run as a script, before anything imports torch (this package's
``__init__`` does).
"""

from __future__ import annotations

import os
import sys

if __name__ == "__main__":  # as a script its folder is sys.path[0] (its real path, links resolved), where this
    # package's modules would shadow the standard library's (``profile``); the package is on PYTHONPATH (background._spawn)
    _HERE = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))
    sys.path[:] = [entry for entry in sys.path if os.path.realpath(entry or os.curdir) != _HERE]

import json
import tempfile
import time

PRECOMPILE_VARIABLE = "COMPILE_CALLBACK_PRECOMPILE"  # "<processes> <the file listing the sources>"
LOWER_BY_VARIABLE = "COMPILE_CALLBACK_LOWER_BY"  # how far the child lowers its priority at its start (os.nice)
PRECOMPILED_VARIABLE = "COMPILE_CALLBACK_PRECOMPILED"  # what the precompile did, for the child's stages
# Packages a compile imports after the run's imports (torch's by folder under torch, the others by name).
COMPILE_STACK = ("_dynamo", "_inductor", "_functorch", "fx", "_subclasses", "_higher_order_ops", "_prims", "_refs",
                 "_decomp", os.path.join("utils", "_sympy"))
COMPILE_STACK_PACKAGES = ("sympy", "triton")


def workers(cores: int) -> int:
    """Processes that compile a child's bytecode on a machine whose process may use ``cores`` cores: half of
    them, at most 8, so training keeps the rest (one: no pool)."""
    return max(1, min(8, cores // 2))


# Counted from the cores this process may run on (a container's limit), not the host's.
WORKERS = workers(len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 2))
_SKIPPED_FOLDERS = {"test", "tests", "testing", "__pycache__"}


def cached_in(folder: str, source: str) -> str:
    """Where an interpreter with ``PYTHONPYCACHEPREFIX=folder`` keeps ``source``'s bytecode (as
    ``importlib.util.cache_from_source`` names it under ``sys.pycache_prefix``)."""
    head, tail = os.path.split(os.path.abspath(source))
    base = tail.rpartition(".")[0] or tail
    return os.path.join(folder, head.lstrip(os.sep), f"{base}.{sys.implementation.cache_tag}.pyc")


def sources(modules: object, torch_folder: str) -> list[str]:
    """The ``.py`` files of ``modules`` (``sys.modules.values()``: the run's imports) and of the compile stack's
    packages (:data:`COMPILE_STACK` under ``torch_folder``, :data:`COMPILE_STACK_PACKAGES` where installed),
    their tests left out; sorted, each once."""
    import importlib.util

    found = {path for path in (getattr(module, "__file__", None) for module in modules)  # type: ignore[attr-defined]
             if isinstance(path, str) and path.endswith(".py") and os.path.isfile(path)}
    folders = [os.path.join(torch_folder, name) for name in COMPILE_STACK]
    for name in COMPILE_STACK_PACKAGES:
        spec = importlib.util.find_spec(name) if name not in sys.modules else sys.modules[name].__spec__
        folders += list(spec.submodule_search_locations or []) if spec is not None else []
    for folder in folders:
        for root, subfolders, files in os.walk(folder):
            subfolders[:] = [name for name in subfolders if name not in _SKIPPED_FOLDERS]
            found.update(os.path.join(root, name) for name in files if name.endswith(".py"))
    return sorted(found)


def write_listing(paths: list[str]) -> str:
    """A temporary file listing ``paths``, one a line (the child removes it); :data:`PRECOMPILE_VARIABLE`'s
    value for a child that compiles them in :data:`WORKERS` processes (at its own priority, lowered first)."""
    handle, listing = tempfile.mkstemp(prefix="compile-callback-sources-", suffix=".txt")
    with os.fdopen(handle, "w") as file:
        file.write("\n".join(paths))
    return f"{WORKERS} {listing}"


def listing_of(value: str) -> str:
    """The listing's path in a :data:`PRECOMPILE_VARIABLE` value."""
    return value.split(" ", 1)[1]


def _compile(paths: list[str]) -> int:
    import py_compile

    done = 0
    for path in paths:
        # To sys.pycache_prefix (PYTHONPYCACHEPREFIX). A source that does not compile returns None (quiet=2),
        # one that cannot be read or written raises: its import compiles it, or fails, as it would have.
        try:
            done += py_compile.compile(path, quiet=2) is not None
        except OSError:
            pass
    return done


def lower(niceness: int) -> None:
    """This process's priority ``niceness`` below what it is; the processes it starts after inherit it."""
    try:
        os.nice(niceness)
    except (AttributeError, OSError):  # no os.nice (Windows) or not allowed: as it is
        pass


def precompile(listing: str, workers: int) -> dict[str, float]:
    """Compiles the sources ``listing`` names to bytecode in ``workers`` processes at this one's priority
    (forked: this interpreter has imported nothing that forking would break) and removes the listing; what it did."""
    import concurrent.futures
    import multiprocessing

    started = time.monotonic()
    with open(listing) as file:
        paths = [line for line in file.read().splitlines() if line]
    os.remove(listing)
    chunks = [paths[i::workers * 4] for i in range(workers * 4)]  # interleaved: big packages spread out
    if workers > 1:
        with concurrent.futures.ProcessPoolExecutor(workers, mp_context=multiprocessing.get_context("fork")) as pool:
            done = sum(pool.map(_compile, chunks))
    else:
        done = _compile(paths)
    return {"sources": len(paths), "compiled": done, "workers": workers, "seconds": time.monotonic() - started}


def main() -> None:
    """The child's start: its priority lowered (:data:`LOWER_BY_VARIABLE`), the precompile where asked for
    (:data:`PRECOMPILE_VARIABLE`), then the child as ``python -m compile_callback.background`` would run it,
    with this script's arguments."""
    import runpy

    lower(int(os.environ.pop(LOWER_BY_VARIABLE, None) or 0))  # popped: nothing it starts lowers itself again
    asked = os.environ.pop(PRECOMPILE_VARIABLE, None)
    if asked:
        try:
            workers, listing = asked.split(" ", 1)
            os.environ[PRECOMPILED_VARIABLE] = json.dumps(precompile(listing, int(workers)))
        except Exception as error:  # the imports then compile from the sources, as without it
            print(f"bytecode not compiled first: {type(error).__name__}: {error}", flush=True)
    runpy.run_module("compile_callback.background", run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main()
