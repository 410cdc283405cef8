"""Every use of a private torch API in this package, in one place.

Checked on torch 2.14.1 (CPU CI) and torch 2.11.0 (the H200 machine). When torch moves one of these,
this is the only module to change; the rest of the package speaks public API.

What we read, and why it is the right source:
- ``torch._dynamo.callback.callback_handler``: start/end hooks around every frame compile (trigger
  ``DYNAMO``) and every lazily compiled backward (``LAZY_BACKWARD``), each with dynamo's compile id
  ("frame/attempt"). The start hook runs on the thread, and under the Python stack, of the call that
  triggered the compile, which is how we attribute a compile to the region that was running.
- ``torch._dynamo.utils.get_compilation_metrics()``: dynamo's own per-compile record (recompile
  reason = the guard that failed, failure type = e.g. the recompile limit, compile time split, cache
  hits). It is a bounded deque (64 by default), so we drain it after every step that compiled; its
  newest entry is read every step from the deque (``_compilation_metrics``) without a copy.
- ``torch._dynamo.utils.graph_break_reasons``: dynamo's own list of graph breaks with the user stack;
  ``torch._dynamo.utils.counters["stats"]["unique_graphs"]``: dynamo's own graph count.
- The reason text dynamo's DDPOptimizer gives the pieces it splits a graph into under DDP
  ("DDPOptimizer intentional graph-break"): recorded among graph breaks, though no eager code runs
  between the pieces.
- ``nn.Module._compiled_call_impl``: ``nn.Module.compile`` sets it; there is no public way to undo it.
- ``torch.utils._pytree``: flattening nested outputs (tuples, dicts, dataclasses) the way torch does.
- ``torch.utils._python_dispatch.TorchDispatchMode``: :func:`random_draws_in_float32`, so a float64
  reference draws the random numbers a float32 run draws.
- ``torch._inductor.config.fallback_random``, ``torch._dynamo.config.use_numpy_random_stream`` and
  ``TORCHINDUCTOR_CACHE_DIR``: see the functions below.
- ``torch._inductor.list_mode_options``: the options a mode stands for; dynamo's per-code-object cache,
  the globals it puts compiled functions in, and its backend check: :class:`TwinScope`.
- ``torch._inductor.lowering.fallbacks``: the ops Inductor runs as eager (ATen) kernels inside its
  compiled code because it has no lowering of its own; ``torch.autograd.profiler._is_profiler_enabled``:
  whether a profiler already runs (a second one cannot start).
- ``torch._inductor.list_options()``: the option names ``torch.compile(options=...)`` accepts, so a
  misspelt one fails in ``setup`` rather than at the first compile, mid-training. (2.14.1: 644 names.)
- ``torch._functorch.config.force_non_lazy_backward_lowering``: see :func:`compile_backward_with_forward`.
- ``save_config()`` / ``load_config()`` of ``torch._dynamo.config``, ``torch._inductor.config`` and
  ``torch._functorch.config``, and ``torch._inductor.config.fx_graph_cache`` / ``force_disable_caches``:
  a background compile's child process compiles under the run's configuration (it is part of Inductor's
  cache keys), and only where the FX-graph cache can hand the result over (:mod:`compile_callback.background`).
- Profiler event names that torch gives its compiled code: ``CompiledFunction`` and
  ``CompiledFunctionBackward`` (AOTAutograd's forward and backward), ``## Call CompiledFxGraph <key> ##``
  (Inductor's compiled graph) and ``TorchDynamo Cache Lookup`` (dynamo checking a frame's guards).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn

# ``callback_handler`` moved into torch._dynamo.callback in 2.6 and has kept its name since.
from torch._dynamo.callback import callback_handler as _callback_handler
from torch._dynamo.utils import counters as _counters

_COMPILE_ID = re.compile(r"^!?(\d+)/(\d+)")


@dataclasses.dataclass(frozen=True)
class CompileEvent:
    """One compile that dynamo started: a frame (``DYNAMO``) or a lazy backward (``LAZY_BACKWARD``)."""

    compile_id: str
    trigger: str
    frame_id: int | None
    attempt: int | None


def parse_compile_id(compile_id: str) -> tuple[int | None, int | None]:
    """Splits dynamo's ``"frame_id/frame_compile_id[_restart]"`` into its two numbers."""
    match = _COMPILE_ID.match(compile_id or "")
    if not match:
        return None, None
    return int(match.group(1)), int(match.group(2))


def install_compile_hooks(
    on_start: Callable[[CompileEvent], None], on_end: Callable[[CompileEvent], None]
) -> tuple[Callable[[Any], None], Callable[[Any], None]]:
    """Registers start/end hooks around each dynamo compile; returns the handles for removal."""

    def event(args: Any) -> CompileEvent:
        # Hooks get CallbackArgs(callback_trigger, compile_id) since torch 2.7; older ones get nothing.
        if args is None:
            compile_id = str(torch._guards.CompileContext.current_compile_id())
            trigger = "DYNAMO"
        else:
            compile_id, trigger = str(args.compile_id), args.callback_trigger.name
        frame_id, attempt = parse_compile_id(compile_id)
        return CompileEvent(compile_id, trigger, frame_id, attempt)

    def start(args: Any = None) -> None:
        on_start(event(args))

    def end(args: Any = None) -> None:
        on_end(event(args))

    _callback_handler.register_start_callback(start)
    _callback_handler.register_end_callback(end)
    return start, end


def compile_hooks_installed(handles: tuple[Callable[[Any], None], Callable[[Any], None]]) -> bool:
    """``torch._dynamo.reset()`` clears every hook; callers re-install when this is False."""
    return handles[0] in _callback_handler.start_callbacks


def remove_compile_hooks(handles: tuple[Callable[[Any], None], Callable[[Any], None]]) -> None:
    start, end = handles
    if start in _callback_handler.start_callbacks:
        _callback_handler.remove_start_callback(start)
    if end in _callback_handler.end_callbacks:
        _callback_handler.remove_end_callback(end)


def unique_graphs() -> int:
    """Dynamo's own count of graphs compiled in this process (since the last ``reset``)."""
    return int(_counters["stats"]["unique_graphs"])


def graph_break_count() -> int:
    """Dynamo's own count of graph breaks in this process (since the last ``reset``)."""
    return len(torch._dynamo.utils.graph_break_reasons)


DDP_SPLIT_REASON = "DDPOptimizer intentional graph-break"


@dataclasses.dataclass(frozen=True)
class GraphBreak:
    reason: str
    location: str  # "file:line in function", the user code where dynamo broke the graph

    @property
    def ddp_split(self) -> bool:
        """A piece of a graph that DDPOptimizer split at DDP's gradient buckets, not a break in user code."""
        return self.reason.startswith(DDP_SPLIT_REASON)


def graph_breaks_since(index: int) -> list[GraphBreak]:
    """Graph breaks dynamo recorded after position ``index`` of its list, with their user location."""
    breaks = []
    for compile_reason in torch._dynamo.utils.graph_break_reasons[index:]:
        stack = compile_reason.user_stack
        location = f"{stack[-1].filename}:{stack[-1].lineno} in {stack[-1].name}" if stack else "unknown"
        breaks.append(GraphBreak(reason=first_line(compile_reason.reason), location=location))
    return breaks


def first_line(text: str) -> str:
    return (text or "").strip().splitlines()[0] if (text or "").strip() else ""


def describe_error(error: BaseException) -> str:
    """One line for a report: type and first line, plus the cause when dynamo wraps it
    ("BackendCompilerFailed: backend='x' raised:" is followed by the backend's own error)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    text = lines[0] if lines else ""
    if text.endswith(":") and len(lines) > 1:
        text = f"{text} {lines[1]}"
    return f"{type(error).__name__}: {text}"


@dataclasses.dataclass(frozen=True)
class CompileRecord:
    """The fields we use from one of dynamo's ``CompilationMetrics`` records."""

    compile_id: str
    is_forward: bool
    code_name: str | None
    code_location: str | None
    recompile_reason: str | None
    fail_type: str | None
    fail_reason: str | None
    seconds: float
    dynamo_seconds: float
    aot_autograd_seconds: float
    inductor_seconds: float
    fx_cache_hits: int
    fx_cache_misses: int
    aot_cache_hits: int
    aot_cache_misses: int
    graph_ops: int | None
    guard_latency_us: float | None
    cudagraph_skip_reason: str | None

    @property
    def hit_recompile_limit(self) -> bool:
        return "recompile limit exceeded" in (self.fail_reason or "").lower()


def _us(value: int | float | None) -> float:
    return float(value or 0) / 1e6


def compile_records() -> list[CompileRecord]:
    """Dynamo's compile records still held in its bounded deque, oldest first."""
    records = []
    for metrics in torch._dynamo.utils.get_compilation_metrics():
        if metrics.start_time_us is not None and metrics.end_time_us is not None:
            seconds = _us(metrics.end_time_us - metrics.start_time_us)
        else:
            seconds = float(metrics.entire_frame_compile_time_s or 0.0)
        location = (
            f"{metrics.co_filename}:{metrics.co_firstlineno}" if metrics.co_filename is not None else None
        )
        records.append(
            CompileRecord(
                compile_id=str(metrics.compile_id),
                is_forward=metrics.is_forward is not False,
                code_name=metrics.co_name,
                code_location=location,
                recompile_reason=getattr(metrics, "recompile_reason", None),
                fail_type=metrics.fail_type,
                fail_reason=metrics.fail_reason,
                seconds=seconds,
                dynamo_seconds=_us(metrics.dynamo_cumulative_compile_time_us),
                aot_autograd_seconds=_us(metrics.aot_autograd_cumulative_compile_time_us),
                inductor_seconds=_us(metrics.inductor_cumulative_compile_time_us),
                fx_cache_hits=int(metrics.inductor_fx_local_cache_hit_count or 0)
                + int(metrics.inductor_fx_remote_cache_hit_count or 0),
                fx_cache_misses=int(metrics.inductor_fx_local_cache_miss_count or 0)
                + int(metrics.inductor_fx_remote_cache_miss_count or 0),
                aot_cache_hits=int(metrics.aotautograd_local_cache_hit_count or 0)
                + int(metrics.aotautograd_remote_cache_hit_count or 0),
                aot_cache_misses=int(metrics.aotautograd_local_cache_miss_count or 0)
                + int(metrics.aotautograd_remote_cache_miss_count or 0),
                graph_ops=metrics.graph_op_count,
                guard_latency_us=getattr(metrics, "guard_latency_us", None),
                cudagraph_skip_reason=getattr(metrics, "cudagraph_skip_reason", None),
            )
        )
    return records


def compile_record_count_marker() -> object | None:
    """Identity of the newest record, to find the new ones without relying on the deque's length.

    Read every step, so from dynamo's deque itself (``_compilation_metrics``, rebound when its size is
    set: looked up each time) rather than ``get_compilation_metrics()``, which copies it into a list."""
    records = getattr(torch._dynamo.utils, "_compilation_metrics", None)
    if records is None:
        records = torch._dynamo.utils.get_compilation_metrics()
    return records[-1] if records else None


def records_after(marker: object | None) -> list[CompileRecord]:
    """Records appended after ``marker`` (from :func:`compile_record_count_marker`)."""
    raw = torch._dynamo.utils.get_compilation_metrics()
    start = 0
    if marker is not None:
        for index in range(len(raw) - 1, -1, -1):
            if raw[index] is marker:
                start = index + 1
                break
    all_records = compile_records()
    return all_records[start:]


def uncompile_module(module: nn.Module) -> None:
    """Undoes ``module.compile()``: the next call runs the plain eager ``forward``."""
    module._compiled_call_impl = None


def is_module_compiled(module: nn.Module) -> bool:
    """Whether ``module.compile()`` is in effect (the tests check plans with it; the attribute is private)."""
    return getattr(module, "_compiled_call_impl", None) is not None


def recompile_limit() -> int:
    """``torch._dynamo.config.recompile_limit`` (named ``cache_size_limit`` before torch 2.7)."""
    config = torch._dynamo.config
    return int(getattr(config, "recompile_limit", getattr(config, "cache_size_limit", 8)))


def set_recompile_limit(limit: int) -> int:
    """Sets dynamo's recompile limit (graphs kept per function before it runs eager); returns the old one."""
    config = torch._dynamo.config
    previous = recompile_limit()
    setattr(config, "recompile_limit" if hasattr(config, "recompile_limit") else "cache_size_limit", int(limit))
    return previous


@contextmanager
def fallback_random() -> Iterator[None]:
    """Makes inductor draw random numbers like eager, so a compiled region can be compared to eager."""
    import torch._inductor.config as inductor_config

    with inductor_config.patch(fallback_random=True):
        yield


@contextmanager
def numpy_draws_in_numpy() -> Iterator[None]:
    """Dynamo traces ``np.random`` calls into torch's own random ops unless
    ``torch._dynamo.config.use_numpy_random_stream``: with it, it breaks the graph there and numpy draws
    them, as eager does (what code traced inside the block is compiled with)."""
    with torch._dynamo.config.patch(use_numpy_random_stream=True):
        yield


def mode_options(mode: str | None) -> dict[str, Any]:
    """The Inductor options a ``torch.compile`` mode stands for (``"reduce-overhead"``: CUDA graphs)."""
    if mode in (None, "default"):
        return {}
    return dict(torch._inductor.list_mode_options(mode))


class TwinScope:
    """One verification twin's compiled callable, shared by the modules of one region (``blocks.*``: one
    compile for all blocks, as the region's own graph is), in a dynamo cache of its own.

    Dynamo keeps compiled graphs per code object, and ``nn.Module.compile`` compiles
    ``nn.Module._call_impl``, whose code every compiled module shares (the module's identity is a guard).
    The twin's top frame is a fresh copy of :func:`_twin_call`'s code with globals of its own (where dynamo
    puts the compiled functions), so what the twin compiles there is neither reused by the modules' own
    compiled calls nor kept: it goes with the scope. Frames below a graph break are shared code: there the
    twin's graphs stay cached (guarded on what differs: another backend, dropout's p), and the module's
    own next compile of such a frame is a recompile (:class:`compile_callback.watch.CompileWatch` counts
    it under the twin)."""

    def __init__(self) -> None:
        import builtins
        import types

        self._function = types.FunctionType(_twin_call.__code__.replace(), {"__builtins__": builtins},
                                            "verification_twin")
        self._compiled: Any = None
        self._kwargs: dict[str, Any] | None = None

    @contextmanager
    def running(self, module: nn.Module, **compile_kwargs: Any) -> Iterator[None]:
        """Inside the block, calling ``module`` runs the twin; its own compiled call is back afterwards."""
        import functools

        global _twins_running
        if self._compiled is None or compile_kwargs != self._kwargs:
            self._compiled, self._kwargs = torch.compile(self._function, **compile_kwargs), compile_kwargs
        own = compiled_call(module)
        module._compiled_call_impl = functools.partial(self._compiled, module)
        _twins_running += 1
        try:
            yield
        finally:
            _twins_running -= 1
            module._compiled_call_impl = own


_twins_running = 0


def twin_running() -> bool:
    """Whether a compile starting now is a verification twin's (:class:`TwinScope`)."""
    return _twins_running > 0


def _twin_call(self: nn.Module, *args: Any, **kwargs: Any) -> Any:
    return self._call_impl(*args, **kwargs)


def tree_leaves(tree: Any) -> list[Any]:
    """The leaves of a nested structure of lists, tuples, dicts and registered containers."""
    from torch.utils._pytree import tree_leaves as leaves

    return list(leaves(tree))


def tree_map(function: Callable[[Any], Any], tree: Any) -> Any:
    """``tree`` with ``function`` applied to each leaf, its containers rebuilt (as :func:`tree_leaves` sees them)."""
    from torch.utils._pytree import tree_map as map_leaves

    return map_leaves(function, tree)


def _narrowed(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.dtype == torch.float64:
        return value.float()
    return torch.float32 if value is torch.float64 else value


@contextmanager
def random_draws_in_float32() -> Iterator[None]:
    """Inside the block, every random op (those torch tags ``nondeterministic_seeded``: ``bernoulli``,
    ``rand*``, ``normal``, ``native_dropout``, ...) that would draw in float64 draws in float32 and its
    result is widened: a float64 run then draws the very numbers a float32 run with the same seed draws
    (a generator draws other numbers for other dtypes, on CUDA). Ops that draw nothing pass through."""
    from torch.utils._python_dispatch import TorchDispatchMode

    class Float32Draws(TorchDispatchMode):
        def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # type: ignore[no-untyped-def]
            kwargs = kwargs or {}
            if torch.Tag.nondeterministic_seeded not in func.tags:
                return func(*args, **kwargs)
            narrow_args, narrow_kwargs = tree_map(_narrowed, (args, kwargs))
            if not any(a is not b for a, b in zip(tree_leaves((args, kwargs)), tree_leaves((narrow_args, narrow_kwargs)))):
                return func(*args, **kwargs)
            result = func(*narrow_args, **narrow_kwargs)
            schema = func._schema.arguments
            written = False
            for index, argument in enumerate(schema):  # in-place draws (``bernoulli_``): into the caller's tensor
                if argument.alias_info is None or not argument.alias_info.is_write:
                    continue
                original, narrowed = ((args[index], narrow_args[index]) if index < len(args)
                                      else (kwargs.get(argument.name), narrow_kwargs.get(argument.name)))
                if isinstance(original, torch.Tensor) and original is not narrowed:
                    original.copy_(narrowed)
                    written = True
            if written and isinstance(result, torch.Tensor) and len(args):
                return args[0]
            return tree_map(lambda v: v.double() if isinstance(v, torch.Tensor) and v.dtype == torch.float32 else v,
                            result)

    with Float32Draws():
        yield


def compiled_call(module: nn.Module) -> Any:
    """The callable ``nn.Module.compile`` installed (holds dynamo's cache for this module), or None."""
    return getattr(module, "_compiled_call_impl", None)


def restore_compiled_call(module: nn.Module, compiled: Any) -> None:
    """Puts back a callable from :func:`compiled_call`, so switching plans back costs no recompile."""
    module._compiled_call_impl = compiled


@contextmanager
def eager_for_now(module: nn.Module) -> Iterator[None]:
    """Runs ``module`` eagerly inside the block and restores its compiled callable afterwards."""
    compiled = compiled_call(module)
    module._compiled_call_impl = None
    try:
        yield
    finally:
        module._compiled_call_impl = compiled


def use_inductor_cache_dir(directory: str) -> str | None:
    """Points Inductor's on-disk caches (FX graphs, AOTAutograd, Triton kernels) at ``directory``.

    Inductor reads ``TORCHINDUCTOR_CACHE_DIR`` each time it looks for a cache entry, so setting it
    before the first compile of a run moves its caches; it is process-wide, hence the previous value is
    returned for the caller to restore. Entries there are loaded the way Inductor loads its own default
    cache (they contain compiled code): use a directory only this user can write.
    """
    import os

    previous = os.environ.get("TORCHINDUCTOR_CACHE_DIR")
    os.environ["TORCHINDUCTOR_CACHE_DIR"] = directory
    return previous


def restore_inductor_cache_dir(previous: str | None) -> None:
    import os

    if previous is None:
        os.environ.pop("TORCHINDUCTOR_CACHE_DIR", None)
    else:
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = previous


# Names of the profiler events around compiled code (see the module docstring).
COMPILED_CODE_EVENTS = ("CompiledFunction", "CompiledFunctionBackward")
COMPILED_GRAPH_EVENT_PREFIX = "## Call CompiledFxGraph"
GUARD_CHECK_EVENT = "TorchDynamo Cache Lookup"
REGION_EVENT_PREFIX = "compile_callback::region::"
_mark_regions = False


def mark_regions(on: bool) -> None:
    """While on, each call of a guarded compiled module runs inside a profiler range named
    ``compile_callback::region::<region>`` (off: one boolean test per call, no range)."""
    global _mark_regions
    _mark_regions = on


def inductor_fallback_names() -> set[str]:
    """``aten::<op>`` names of the ops Inductor runs as ATen fallback kernels (grows as it lowers graphs)."""
    try:
        from torch._inductor.lowering import fallbacks
    except ImportError:  # Inductor not importable: nothing it could have fallen back on
        return set()
    return {str(op.name()).split(".")[0] for op in list(fallbacks) if hasattr(op, "name")}


def compile_backward_with_forward(on: bool) -> bool | None:
    """Makes AOTAutograd compile a graph's backward together with its forward instead of at its first
    backward call, so a backward that fails to compile fails in the forward call, where the region's
    guard reverts it and reruns the call eagerly (a failure inside ``loss.backward()`` could not be undone).
    Returns the previous value to restore, or None where this torch has no such setting."""
    import torch._functorch.config as functorch_config

    if not hasattr(functorch_config, "force_non_lazy_backward_lowering"):
        return None
    previous = bool(functorch_config.force_non_lazy_backward_lowering)
    functorch_config.force_non_lazy_backward_lowering = on
    return previous


def profiler_running() -> bool:
    return bool(torch.autograd.profiler._is_profiler_enabled)


def forward_is_real(module: nn.Module) -> bool:
    """False while something (Lightning's strategies: training_step rerouted) has patched ``module.forward``."""
    return getattr(module.forward, "__func__", None) is type(module).forward


def eager_while_rerouted(module: nn.Module) -> None:
    """Wraps the callable ``nn.Module.compile`` installed so that a call made while ``module.forward`` is
    patched runs eagerly. Lightning's strategies that wrap the model (DDP, FSDP) call ``training_step``
    by patching the LightningModule's ``forward`` and calling the wrapper: compiled, that call would
    trace ``training_step`` (its logging breaks the graph) and recompile every step for the new patch.
    Run eagerly, it calls ``training_step``, whose ``self(...)`` finds the real ``forward`` again and
    runs compiled. Only for the LightningModule itself: other modules' patched forwards (hooks some
    libraries install) are theirs to keep compiled."""
    compiled = compiled_call(module)
    if compiled is None or hasattr(compiled, "_compile_callback_inner"):
        return

    def call(*args: Any, **kwargs: Any) -> Any:
        if not forward_is_real(module):
            return module._call_impl(*args, **kwargs)
        return compiled(*args, **kwargs)

    call._compile_callback_inner = compiled  # type: ignore[attr-defined]
    module._compiled_call_impl = call


def function_mode_depth() -> int:
    """How many ``TorchFunctionMode``s are active on this thread (the tests check that a fit leaves none)."""
    from torch.overrides import _get_current_function_mode_stack

    return len(_get_current_function_mode_stack())


def fall_back_to_eager_on_error(module: nn.Module, on_error: Any, label: str = "") -> None:
    """Wraps the callable ``nn.Module.compile`` installed so that an error it raises (a backend that
    fails to compile, a fullgraph break, a run-time error of compiled code) reverts ``module`` to eager
    and reruns the same call eagerly: the step goes on, no batch is lost and the optimizer steps once.
    ``on_error(module, error)`` is told. A backward that fails to compile fails here too while
    :func:`compile_backward_with_forward` is on; an error raised while a compiled backward runs
    surfaces in ``loss.backward()`` and is not caught."""
    outer = compiled_call(module)
    compiled = getattr(outer, "_compile_callback_inner", outer)  # under eager_while_rerouted's check
    if compiled is None or getattr(compiled, "_compile_callback_guard", False):
        return

    marker = REGION_EVENT_PREFIX + label

    def guarded(*args: Any, **kwargs: Any) -> Any:
        try:
            if _mark_regions:
                with torch.profiler.record_function(marker):
                    return compiled(*args, **kwargs)
            return compiled(*args, **kwargs)
        except Exception as error:  # noqa: BLE001 - any failure of compiled code means: run eager
            module._compiled_call_impl = None
            on_error(module, error)
            return module(*args, **kwargs)

    guarded._compile_callback_guard = True  # type: ignore[attr-defined]
    module._compiled_call_impl = guarded
    if outer is not compiled:
        eager_while_rerouted(module)  # the rerouting check stays outermost


def inductor_option_names() -> set[str]:
    """The option names ``torch.compile(options=...)`` accepts for Inductor (``torch._inductor.list_options``;
    dotted for nested configs, e.g. ``triton.cudagraphs``)."""
    import torch._inductor

    return set(torch._inductor.list_options())


def compile_config_snapshot() -> dict[str, bytes]:
    """Dynamo's, AOTAutograd's and Inductor's configuration now, as bytes another process can load
    (:func:`load_compile_config_snapshot`): a compile there then keys its caches as a compile here would."""
    import torch._dynamo.config
    import torch._functorch.config
    import torch._inductor.config

    return {
        "dynamo": torch._dynamo.config.save_config(),
        "functorch": torch._functorch.config.save_config(),
        "inductor": torch._inductor.config.save_config(),
    }


def load_compile_config_snapshot(snapshot: dict[str, bytes]) -> None:
    import warnings

    import torch._dynamo.config
    import torch._functorch.config
    import torch._inductor.config

    with warnings.catch_warnings():  # deprecated keys are saved and loaded too; loading them warns
        warnings.simplefilter("ignore", FutureWarning)
        torch._dynamo.config.load_config(snapshot["dynamo"])
        torch._functorch.config.load_config(snapshot["functorch"])
        torch._inductor.config.load_config(snapshot["inductor"])


def fx_graph_cache_on() -> bool:
    """Whether Inductor keeps compiled graphs in its on-disk FX-graph cache (a compile another process
    made can then be reused here)."""
    import torch._inductor.config

    config = torch._inductor.config
    return bool(config.fx_graph_cache) and not bool(getattr(config, "force_disable_caches", False))
