"""Regions: which submodules to compile, and the mechanism to compile or revert one in place.

A region is a named group of modules that is compiled or reverted as one decision: a single module
(``"head"``), the whole model (``"model"``), or the repeated blocks a glob pattern names
(``"blocks.*"``), which share compiled code because they are instances of the same class.

Compiling uses ``nn.Module.compile`` so the module object, its parameters and its state-dict keys are
untouched (no ``_orig_mod.`` prefix): a checkpoint of a compiled run loads into a plain model.
"""

from __future__ import annotations

import dataclasses
import difflib
import fnmatch
import importlib
from collections.abc import Callable, Iterable, Sequence
from typing import Any, Union

import torch
from torch import nn

from compile_callback import torch_internals

MODEL = "model"
# A submodule is named in ``regions`` by its path (``"head"``, ``"blocks.*"``), or as ``"self.<path>"``,
# which always means a submodule: ``"model"`` is the whole LightningModule, so a child called ``model``
# (the usual ``self.model = ...``) is region ``"self.model"``. No module name contains a ".", so no
# child can take the root's name or the prefix.
SUBMODULE_PREFIX = "self."


def region_name(module_name: str) -> str:
    """The region name of one submodule (``""`` is the root): its path, unless that would read as the
    whole model."""
    if module_name == "":
        return MODEL
    return SUBMODULE_PREFIX + module_name if module_name == MODEL else module_name

BACKENDS_WITH_MODES = ("inductor",)
# torch's own backends that take no options (torch.compile hands ``options`` to a backend as a keyword:
# these drop it, aot_eager with a logged warning); a backend of the user's may read them.
BACKENDS_WITHOUT_OPTIONS = ("eager", "aot_eager", "aot_eager_decomp_partition", "cudagraphs")
MODES = ("default", "reduce-overhead", "max-autotune", "max-autotune-no-cudagraphs")


Backend = Union[str, Callable[..., Any]]


def resolve_backend(backend: Backend) -> Backend:
    """What ``torch.compile`` gets as its ``backend``: a callable as it is, a registered backend name as it
    is, and a dotted import path (``"my_package.compilers.my_backend"``) as the callable it names.

    Raises:
        ValueError: a string that is neither a registered name nor an importable callable, or any other
            type, with the registered names and how to fix it.
    """
    if callable(backend):
        return backend
    if not isinstance(backend, str) or not backend:
        raise ValueError(f"`backend` must be a torch.compile backend name such as 'inductor', a dotted import "
                         f"path to a backend function, or a callable; got {backend!r}.")
    registered = torch.compiler.list_backends(exclude_tags=())
    if backend in registered:
        return backend
    if "." in backend:
        module_name, _, attribute = backend.rpartition(".")
        try:
            found = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError) as error:
            raise ValueError(f"`backend={backend!r}` is not a registered torch.compile backend and cannot be "
                             f"imported ({type(error).__name__}: {error}). Give a registered name "
                             f"({', '.join(registered)}) or an importable 'package.module.function'.") from error
        if not callable(found):
            raise ValueError(f"`backend={backend!r}` names {type(found).__name__}, not a callable backend "
                             f"function (gm, example_inputs) -> callable.")
        return found
    raise ValueError(f"`backend={backend!r}` is not a registered torch.compile backend: registered are "
                     f"{', '.join(registered)}. Register yours with torch._dynamo.register_backend before fit, "
                     f"or give a dotted import path ('my_package.compilers.my_backend') or the callable itself.")


def backend_name(backend: Backend) -> str:
    """A readable name of a backend for reports and cache keys: the name, or the callable's qualified name."""
    if isinstance(backend, str):
        return backend
    module = getattr(backend, "__module__", None) or ""
    name = getattr(backend, "__qualname__", None) or getattr(backend, "__name__", None) or type(backend).__qualname__
    return f"{module}.{name}" if module else name


@dataclasses.dataclass(frozen=True)
class CompileOptions:
    """What is passed to ``torch.compile`` for a region."""

    backend: Backend = "inductor"
    mode: str | None = None
    fullgraph: bool = False
    dynamic: bool | None = None
    options: dict[str, Any] | None = None

    def as_kwargs(self) -> dict[str, Any]:
        kwargs: dict[str, Any] = {"backend": self.backend, "fullgraph": self.fullgraph, "dynamic": self.dynamic}
        # torch.compile refuses mode and options together; "default" is the same as no mode.
        if self.mode not in (None, "default"):
            kwargs["mode"] = self.mode
        if self.options:
            kwargs["options"] = dict(self.options)
        return kwargs

    def verification_twin(self) -> dict[str, Any] | None:
        """``torch.compile``'s arguments for the twin that verifies a region drawing random numbers, or
        None where the region's own graph can be verified.

        Inductor draws random numbers its own way, so a compiled dropout cannot be compared with eager's.
        Training must not run a graph compiled to compare (Inductor's ``fallback_random``, random numbers
        drawn like eager): it saves what it draws for the backward where Inductor's own recomputes it (on
        the H200 BERT's step took 2.2 GB more, 16.3 GB against 14.05). So a twin is compiled and run with
        the dropout layers at p=0 (``verify.dropout_off``; eager too), with the same options plus
        ``fallback_random`` (for random ops that are no dropout layer; and a backend that differs, so
        frames below a graph break are compiled apart too) and without CUDA graphs (the same kernels
        replayed; a second pool is memory verification need not hold). Other backends draw like eager
        (``eager``, ``aot_eager``) or are the user's: their own graph is verified, with dropout on, under
        ``fallback_random`` in case they lower through Inductor.
        """
        if self.backend != "inductor":
            return None
        options = {**torch_internals.mode_options(self.mode), **(self.options or {}), "fallback_random": True}
        options.pop("triton.cudagraphs", None)
        return {"backend": self.backend, "fullgraph": self.fullgraph, "dynamic": self.dynamic, "options": options}

    @property
    def cuda_graphs(self) -> bool:
        """Whether the region runs as CUDA graphs on a CUDA device (:func:`captures_cuda_graphs`)."""
        return captures_cuda_graphs(self.backend, self.mode, self.options)

    @property
    def mode_name(self) -> str:
        """The mode a decision names: the one given, else (none, or ``default``) ``reduce-overhead`` where the
        options turn CUDA graphs on (torch.compile takes no mode beside options), else ``default``."""
        if self.mode not in (None, "default"):
            return self.mode
        return "reduce-overhead" if self.cuda_graphs else "default"

    def with_cuda_graphs(self) -> CompileOptions | None:
        """These options with Inductor's CUDA graphs on, as the auto planner's CUDA-graph trials compile:
        ``reduce-overhead``, or beside the user's own Inductor ``options`` their ``triton.cudagraphs`` (with
        both torch.compile raises); None where no such trial is to be had: another backend, or CUDA graphs
        on already, or the options say ``triton.cudagraphs`` themselves (``False``: the user's no)."""
        if self.backend != "inductor" or self.cuda_graphs or "triton.cudagraphs" in (self.options or {}):
            return None
        if self.options:
            return dataclasses.replace(self, options={**self.options, "triton.cudagraphs": True})
        return dataclasses.replace(self, mode="reduce-overhead")

    def describe(self) -> str:
        parts = [backend_name(self.backend)]
        if self.mode:
            parts.append(self.mode)
        if self.dynamic is not None:
            parts.append(f"dynamic={self.dynamic}")
        if self.fullgraph:
            parts.append("fullgraph")
        return ", ".join(parts)


@dataclasses.dataclass
class Region:
    """A named group of modules compiled or reverted together.

    Attributes:
        name: what the user wrote (``"blocks.*"``, ``"head"``, ``"model"``) or what the planner chose.
        module_names: qualified names of the modules in the group (``""`` is the root module).
        modules: the module objects, same order.
    """

    name: str
    module_names: list[str]
    modules: list[nn.Module]
    compiled_with: CompileOptions | None = None

    @property
    def is_compiled(self) -> bool:
        return self.compiled_with is not None



def _matches(pattern: str, name: str) -> bool:
    """Glob over dotted names, one component per ``*``: ``blocks.*`` is ``blocks.0`` but not ``blocks.0.attn``."""
    pattern_parts = pattern.split(".")
    name_parts = name.split(".")
    return len(pattern_parts) == len(name_parts) and all(
        fnmatch.fnmatchcase(part, pattern_part) for part, pattern_part in zip(name_parts, pattern_parts)
    )


def resolve_regions(root: nn.Module, specs: Sequence[str]) -> list[Region]:
    """Turns region names and glob patterns into :class:`Region` objects over ``root``'s submodules.

    Args:
        root: the model (a LightningModule or any ``nn.Module``).
        specs: ``"model"`` for ``root`` itself, submodule names (``"head"``, ``"encoder.layers.0"``) or
            glob patterns, one ``*`` per name component (``"blocks.*"``, ``"layer*"``); a name may start
            with ``"self."`` (``"self.model"``: the submodule ``model``, not the whole model).

    Raises:
        ValueError: a name or pattern that matches no submodule (with the closest names), a pattern
            given twice, or two specs that overlap (a module inside another compiled module).

    Example:
        >>> regions = resolve_regions(model, ["blocks.*", "head"])
    """
    named = dict(root.named_modules())
    names = [name for name in named if name]
    regions: list[Region] = []
    claimed: dict[str, str] = {}
    for spec in specs:
        path = spec[len(SUBMODULE_PREFIX):] if spec.startswith(SUBMODULE_PREFIX) else spec
        if spec == MODEL:
            matched = [""]
        elif any(char in path for char in "*?["):
            matched = [name for name in names if _matches(path, name)]
        else:
            matched = [path] if path in named and path else []
        if not matched:
            close = difflib.get_close_matches(spec, names, n=5, cutoff=0.5)
            hint = f" Close matches: {', '.join(repr(c) for c in close)}." if close else ""
            top_level = [name for name in names if "." not in name][:12]
            raise ValueError(
                f"region {spec!r} matches no submodule of {type(root).__name__}.{hint} "
                f"Use 'model' for the whole model, a submodule name ('self.model' for a submodule called "
                f"model) or a glob pattern over names; "
                f"top-level submodules are: {', '.join(top_level) or '(none)'}."
            )
        for name in matched:
            for other_name, other_spec in claimed.items():
                if name == other_name or _is_inside(name, other_name) or _is_inside(other_name, name):
                    raise ValueError(
                        f"regions {other_spec!r} and {spec!r} overlap on {name or MODEL!r}: a module "
                        f"can be in one compiled region only. Remove one of them or name disjoint submodules."
                    )
            claimed[name] = spec
        regions.append(Region(name=spec, module_names=matched, modules=[named[name] for name in matched]))
    return regions


def _is_inside(name: str, parent: str) -> bool:
    return parent == "" or name.startswith(parent + ".")


def compile_region(region: Region, options: CompileOptions, *, on_error: Any = None) -> None:
    """Compiles each module of ``region`` in place; compilation itself happens at the next call.

    Args:
        on_error: if given, the region is guarded at once (see :func:`guard_region`).
    """
    for name, module in zip(region.module_names, region.modules):
        module.compile(**options.as_kwargs())
        if name in ("", MODEL):  # the LightningModule: a strategy may reroute training_step through its forward
            torch_internals.eager_while_rerouted(module)
    region.compiled_with = options
    if on_error is not None:
        guard_region(region, on_error)


def guard_region(region: Region, on_error: Any) -> None:
    """From now on, an error from compiling or running ``region``'s compiled code reverts the region,
    reruns the failing call eagerly and calls ``on_error(region, error)``: the step is not lost."""
    for module in region.modules:
        torch_internals.fall_back_to_eager_on_error(
            module, lambda _module, error: _failed(region, error, on_error), label=region.name
        )


def _failed(region: Region, error: BaseException, on_error: Any) -> None:
    if region.is_compiled:
        revert_region(region)
        on_error(region, error)


def revert_region(region: Region) -> None:
    """Restores plain eager execution for every module of ``region``."""
    for module in region.modules:
        torch_internals.uncompile_module(module)
    region.compiled_with = None


def captures_cuda_graphs(backend: Backend, mode: str | None, options: dict[str, Any] | None) -> bool:
    """Whether ``torch.compile(backend=backend, mode=mode, options=options)`` runs CUDA graphs on a CUDA device:
    Inductor's ``triton.cudagraphs``, which ``reduce-overhead`` and ``max-autotune`` turn on and ``options``
    may set either way, or dynamo's ``cudagraphs`` backend. Their memory pool stays between steps, so
    eager steps cannot be interleaved with them and the pool must fit beside the rest."""
    if backend == "cudagraphs":
        return True
    if backend != "inductor":
        return False
    return bool({**torch_internals.mode_options(mode), **(options or {})}.get("triton.cudagraphs"))


def uses_cuda_graphs(regions: Iterable[Any]) -> bool:
    """Whether a compiled region runs as CUDA graphs: compiled so (:attr:`CompileOptions.cuda_graphs`), its
    parameters on a CUDA device (elsewhere Inductor captures none)."""
    return any(region.compiled_with is not None and region.compiled_with.cuda_graphs
               and any(p.is_cuda for module in region.modules for p in module.parameters(recurse=True))
               for region in regions)
