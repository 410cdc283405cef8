"""Compile anatomy measured on a few sampled steps: graph coverage, fallback kernels and guard cost.

A sampled step runs under ``torch.profiler`` with CPU activity only (op events, no kernel trace). Its
events say where each ATen op ran:

- inside AOTAutograd's ``CompiledFunction`` / ``CompiledFunctionBackward`` or Inductor's
  ``## Call CompiledFxGraph`` ranges: in a compiled graph. The outermost ATen ops found there are the
  library kernels the compiled code calls: matmuls and convolutions Inductor hands to cuBLAS/cuDNN
  ("extern" kernels), and the ops it has no lowering for and runs as ATen fallbacks (named in
  ``torch._inductor.lowering.fallbacks``);
- ``TorchDynamo Cache Lookup`` ranges: dynamo checking guards before running compiled code;
- every other outermost ATen op ran eagerly. Counted are those of the LightningModule's
  ``training_step`` (inside a profiler range the sampler puts around it) and of the backward nodes that
  its ops created (linked by autograd's sequence numbers). Lightning's own ops around the step (the
  detached copy of the loss) and autograd's bookkeeping (``AccumulateGrad``, the seed gradient of
  ``backward()``) are not the model's: not counted.

Graph coverage S = 1 - (eager ops of this step) / (eager ops of the same step run fully eager, sampled
before anything was compiled). The unit is the outermost ATen op as eager PyTorch dispatches it, the
same on both sides; S = 1 means nothing of the model's forward and backward runs outside a graph.
Per region, forward ops are attributed by profiler ranges around the region's calls and backward ops by
autograd's sequence numbers, which link a backward node to the forward op that made it.

Host syncs: ``aten::_local_scalar_dense`` is what ``.item()``, ``float()``, ``int()`` and ``bool()`` of a
tensor run; on a GPU the host waits there until the device has caught up, and the device then idles
while the host prepares the next work. They are counted inside the sampled step and, by a second short
profile (:class:`BetweenStepsProbe`), between one batch's end and the next batch's start, where
Lightning converts the metrics logged with ``prog_bar=True`` to numbers after every batch; when that
interval reads values, the next one is watched with a ``TorchFunctionMode`` that names the code.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import inspect
import os
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Sequence
from typing import Any

import torch
from torch import nn
from torch.overrides import TorchFunctionMode
from torch.profiler import ProfilerActivity, record_function
from torch.utils.hooks import RemovableHandle

from compile_callback import telemetry, torch_internals
from compile_callback.regions import uses_cuda_graphs

BACKWARD_EVENT = "compile_callback::backward"
STEP_EVENT = "compile_callback::training_step"
ENGINE_EVENT_PREFIX = "autograd::engine::evaluate_function: "
ACCUMULATE_GRAD = "torch::autograd::AccumulateGrad"
HOST_SYNC_OP = "aten::_local_scalar_dense"  # .item(), float(), int(), bool() of a tensor
# Lightning's conversion of progress-bar metrics to Python numbers, run after every training batch.
PROGRESS_BAR_FRAME = "convert_tensors_to_scalars"
PROGRESS_BAR_SITE = "Lightning: metrics logged with prog_bar=True, converted to numbers after each batch"
# Lightning's flush of logged metrics to the loggers: every log_every_n_steps, not every step.
LOGGER_FLUSH_FRAMES = {"update_train_step_metrics", "log_metrics"}


@dataclasses.dataclass
class StepOps:
    """What one sampled step ran, counted from its profiler events.

    Attributes:
        eager_ops: outermost ATen ops of the forward and backward that ran eagerly.
        region_eager_ops: the same, per region range they ran in (a nested op counts for every
            enclosing region).
        eager_op_names: ``eager_ops`` by name (``aten::detach``: 2).
        library_calls: outermost ATen ops inside compiled graphs, by name (``aten::mm``: 4).
        guard_checks: ``TorchDynamo Cache Lookup`` ranges (one per call of a compiled frame).
        guard_us: microseconds inside them.
        host_syncs: host reads of a tensor's value (``aten::_local_scalar_dense``) during the step.
    """

    eager_ops: int = 0
    region_eager_ops: dict[str, int] = dataclasses.field(default_factory=dict)
    eager_op_names: dict[str, int] = dataclasses.field(default_factory=dict)
    library_calls: dict[str, int] = dataclasses.field(default_factory=dict)
    guard_checks: int = 0
    guard_us: float = 0.0
    host_syncs: int = 0

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _is_compiled_code(name: str) -> bool:
    return name in torch_internals.COMPILED_CODE_EVENTS or name.startswith(torch_internals.COMPILED_GRAPH_EVENT_PREFIX)


# Long on purpose: one pass over the events fills every count, so each event is classified once.
def count_ops(events: Iterable[Any]) -> StepOps:
    """Counts a sampled step's profiler events (``FunctionEvent``s with ``cpu_parent`` links)."""
    result = StepOps()
    regions_of_sequence: dict[int, set[str]] = collections.defaultdict(set)
    step_sequences: set[int] = set()  # sequence numbers of the forward ops of training_step
    backward_ops: list[tuple[int, str]] = []  # (sequence number of the backward node, op name) per eager op
    names: collections.Counter[str] = collections.Counter()
    region_ops: collections.Counter[str] = collections.Counter()
    library: collections.Counter[str] = collections.Counter()
    prefix = torch_internals.REGION_EVENT_PREFIX
    events = list(events)
    # Inductor's own graph-call range (torch >= 2.x): without it, all of AOTAutograd's range counts.
    graph_calls = any(e.name.startswith(torch_internals.COMPILED_GRAPH_EVENT_PREFIX) for e in events)
    for event in events:
        name = event.name
        if name == torch_internals.GUARD_CHECK_EVENT:
            result.guard_checks += 1
            result.guard_us += float(event.cpu_time_total)
            continue
        if not name.startswith("aten::"):
            continue
        if name == HOST_SYNC_OP:
            result.host_syncs += 1  # usually inside aten::item, so counted before the outermost test
        outermost, compiled, backward, in_step = True, False, False, False
        innermost_code: str | None = None  # the nearest compiled-code range around the op
        engine: Any = None
        regions: list[str] = []
        parent = event.cpu_parent
        while parent is not None:
            parent_name = parent.name
            if parent_name.startswith("aten::"):
                outermost = False
            elif _is_compiled_code(parent_name):
                compiled = True
                innermost_code = innermost_code or parent_name
            elif parent_name.startswith(ENGINE_EVENT_PREFIX):
                if engine is None:
                    engine = parent
            elif parent_name == BACKWARD_EVENT:
                backward = True
            elif parent_name == STEP_EVENT:
                in_step = True
            elif parent_name.startswith(prefix):
                regions.append(parent_name[len(prefix):])
            parent = parent.cpu_parent
        in_backward = backward or engine is not None
        if in_step and not in_backward and event.sequence_nr >= 0:
            step_sequences.add(event.sequence_nr)
            regions_of_sequence[event.sequence_nr].update(regions)
        if not outermost:
            continue
        if compiled:
            # Inside Inductor's graph call: a kernel the compiled code calls. Outside it, in AOTAutograd's
            # runtime wrapper (views of aliased outputs, copies for mutated inputs): bookkeeping.
            if innermost_code.startswith(torch_internals.COMPILED_GRAPH_EVENT_PREFIX) or not graph_calls:
                library[name] += 1
            continue
        if in_backward:
            if engine is not None and not engine.name.endswith(ACCUMULATE_GRAD):
                backward_ops.append((engine.sequence_nr, name))
        elif in_step:
            region_ops.update(set(regions))
            result.eager_ops += 1
            names[name] += 1
    for sequence_nr, op_name in backward_ops:
        if sequence_nr in step_sequences:
            result.eager_ops += 1
            names[op_name] += 1
            for region in regions_of_sequence[sequence_nr]:
                region_ops[region] += 1
    result.region_eager_ops = dict(region_ops)
    result.eager_op_names = dict(names.most_common())
    result.library_calls = dict(library)
    return result


@contextlib.contextmanager
def _native_stderr_silenced() -> Any:
    """Torch's profiler (kineto, torch 2.14) prints ``USDT:... profiler_start`` / ``profiler_stop`` on the
    process's stderr at every start and stop: ten lines in one ``make run`` that the user never asked
    for. Only the callback's own start and stop calls run with file descriptor 2 pointed at the null
    device; a profiler of the user's, and everything else, prints as before."""
    try:
        sys.stderr.flush()  # what Python already wrote goes out first
        saved = os.dup(2)
    except (OSError, ValueError, AttributeError):  # no real stderr (embedded, closed): nothing to silence
        yield
        return
    null = os.open(os.devnull, os.O_WRONLY)
    try:
        os.dup2(null, 2)
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(null)


def _start_cpu_profiler() -> torch.profiler.profile | None:
    """A started ``torch.profiler`` of CPU ops, or None when another profiler runs or it cannot start
    (then nothing is measured and training goes on)."""
    if torch_internals.profiler_running():
        return None
    profiler = torch.profiler.profile(activities=[ProfilerActivity.CPU])
    try:
        with warnings.catch_warnings():  # "clears events at the end of each cycle": one cycle is all we use
            warnings.simplefilter("ignore", UserWarning)
            with _native_stderr_silenced():
                profiler.start()
    except RuntimeError:
        return None
    return profiler


class StepSampler:
    """Profiles one training step at a time and counts its ops (:func:`count_ops`).

    ``start`` at the batch start, ``backward_started``/``backward_ended`` around ``loss.backward()``,
    ``stop`` after the backward (or at the batch end). While sampling, ``module.training_step`` runs
    inside a profiler range (an instance attribute set for the step and removed after). ``marked``
    modules (eager ones only: a hook on a compiled module would make dynamo recompile) get a profiler
    range per call, named by region; compiled regions get theirs from their guard.
    """

    def __init__(self) -> None:
        self._profiler: torch.profiler.profile | None = None
        self._handles: list[RemovableHandle] = []
        self._open: list[Any] = []
        self._module: nn.Module | None = None
        self.processing_seconds = 0.0  # host time spent stopping the profiler and counting its events

    @property
    def active(self) -> bool:
        return self._profiler is not None

    def start(self, module: nn.Module, marked: dict[str, Sequence[nn.Module]] | None = None) -> bool:
        """Starts profiling; False (and nothing started) when another profiler is already running."""
        if self._profiler is not None:
            return False
        if "training_step" in vars(module):
            return False  # someone else replaced training_step on the instance: leave it alone
        profiler = _start_cpu_profiler()
        if profiler is None:
            return False
        self._profiler = profiler
        training_step = module.training_step

        def marked_training_step(*args: Any, **kwargs: Any) -> Any:
            with record_function(STEP_EVENT):
                return training_step(*args, **kwargs)

        module.training_step = marked_training_step  # type: ignore[method-assign]
        self._module = module
        torch_internals.mark_regions(True)
        for label, modules in (marked or {}).items():
            for module in modules:
                self._handles.append(module.register_forward_pre_hook(self._enter(label)))
                self._handles.append(module.register_forward_hook(self._exit, always_call=True))
        return True

    def _enter(self, label: str):
        def hook(module: nn.Module, args: Any) -> None:
            marker = record_function(torch_internals.REGION_EVENT_PREFIX + label)
            marker.__enter__()
            self._open.append(marker)

        return hook

    def _exit(self, module: nn.Module, args: Any, output: Any) -> None:
        if self._open:
            self._open.pop().__exit__(None, None, None)

    def backward_started(self) -> None:
        if self._profiler is not None:
            marker = record_function(BACKWARD_EVENT)
            marker.__enter__()
            self._open.append(marker)

    def backward_ended(self) -> None:
        if self._profiler is not None and self._open:
            self._open.pop().__exit__(None, None, None)

    def stop(self) -> StepOps | None:
        """Stops profiling and returns the counts (None if nothing was being profiled)."""
        if self._profiler is None:
            return None
        while self._open:  # a forward that raised leaves its range open
            self._open.pop().__exit__(None, None, None)
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        torch_internals.mark_regions(False)
        if self._module is not None:
            del self._module.training_step  # the class's method again
            self._module = None
        profiler, self._profiler = self._profiler, None
        started = time.perf_counter()
        with _native_stderr_silenced():
            profiler.stop()
        ops = count_ops(profiler.events())
        self.processing_seconds += time.perf_counter() - started
        return ops


@dataclasses.dataclass
class HostSyncs:
    """The host syncs seen between two training steps (one batch's end to the next one's start).

    Attributes:
        count: reads made at every step: the sum of the kinds below but ``periodic``.
        sites: reads by the training code, by Python frame (``file(line): function``), with counts.
        lightning_sites: reads Lightning makes itself at every batch (e.g. its SIGTERM broadcast under
            multi-process strategies), by frame.
        progress_bar: reads by Lightning's conversion of metrics logged with ``prog_bar=True``.
        unseen: reads the profiler saw but no Python call made directly (inside another torch call,
            e.g. formatting or printing a tensor).
        periodic: reads that are not per step, not in ``count``: Lightning's flush to the loggers
            (every ``log_every_n_steps``).
        named: the reads were seen with their Python stacks and sorted as above; otherwise ``count``
            is every ``aten::_local_scalar_dense`` of the interval and nothing else is known.
    """

    count: int = 0
    sites: dict[str, int] = dataclasses.field(default_factory=dict)
    lightning_sites: dict[str, int] = dataclasses.field(default_factory=dict)
    progress_bar: int = 0
    unseen: int = 0
    periodic: int = 0
    named: bool = True

    def all_sites(self) -> dict[str, int]:
        """Every per-step site with its count, for the report."""
        named = {**self.sites, **self.lightning_sites}
        if self.progress_bar:
            named[PROGRESS_BAR_SITE] = self.progress_bar
        if self.unseen:
            named[UNSEEN_SITE] = self.unseen
        return named


# Reads of a tensor's value (a host sync for a tensor on the GPU), and copies to the host (a sync
# unless non_blocking, only for a tensor off the CPU).
VALUE_READS = frozenset({"item", "__bool__", "__float__", "__int__", "__index__", "tolist", "numpy"})
SCALAR_READS = frozenset({"item", "__bool__", "__float__", "__int__", "__index__"})  # one _local_scalar_dense each
HOST_COPIES = frozenset({"cpu", "nonzero", "to"})
FRAMEWORK_MODULES = frozenset({"lightning", "lightning_utilities", "lightning_fabric", "pytorch_lightning"})
UNSEEN_SITE = "(no Python call of its own: inside another torch call, e.g. formatting or printing a tensor)"


@dataclasses.dataclass(frozen=True)
class Frame:
    """One Python frame of a host read's stack: its module (``__name__``) and where it is."""

    module: str
    where: str  # "lightning/pytorch/loops/fit_loop.py(217): run"
    function: str

    @property
    def package(self) -> str:
        return self.module.split(".", 1)[0]


def _short_path(filename: str) -> str:
    """The path inside site-packages, else the path from the working directory, else the file name."""
    path = filename.replace(os.sep, "/")
    for marker in ("site-packages/", "dist-packages/"):
        if marker in path:
            return path.rsplit(marker, 1)[1]
    relative = os.path.relpath(filename)
    return relative.replace(os.sep, "/") if not relative.startswith("..") else os.path.basename(path)


def _stack_here(skip: int) -> list[Frame]:
    """The calling Python frames, innermost first, ``skip`` frames above this one."""
    frames = []
    frame = inspect.currentframe()
    for _ in range(skip + 1):
        frame = frame.f_back if frame is not None else None
    while frame is not None:
        code = frame.f_code
        frames.append(Frame(
            str(frame.f_globals.get("__name__", "")), f"{_short_path(code.co_filename)}({frame.f_lineno}): {code.co_name}",
            code.co_name,
        ))
        frame = frame.f_back
    return frames


def _copies_to_host(name: str, tensor: torch.Tensor, args: tuple[Any, ...], kwargs: dict[str, Any]) -> bool:
    if tensor.device.type == "cpu" or kwargs.get("non_blocking"):
        return False
    if name != "to":
        return True
    for target in (*args[1:], kwargs.get("device")):
        if isinstance(target, (str, torch.device)):
            try:
                if torch.device(target).type == "cpu":
                    return True
            except RuntimeError:
                continue  # a dtype name or such: not a device
    return False


class _HostReadRecorder(TorchFunctionMode):
    """Records the Python stack of every host read made while it is active, in this process only
    (a DataLoader worker forked meanwhile inherits the mode and must not record)."""

    def __init__(self, device_type: str) -> None:
        super().__init__()
        self.device_type = device_type
        self.pid = os.getpid()
        self.stacks: list[list[Frame]] = []
        self.value_reads = 0  # scalar reads on any device: what the profiler's _local_scalar_dense count holds

    def __torch_function__(self, func: Any, types: Any, args: tuple[Any, ...] = (), kwargs: Any = None) -> Any:
        kwargs = kwargs or {}
        tensor = args[0] if args and isinstance(args[0], torch.Tensor) else None
        if tensor is not None and os.getpid() == self.pid:
            name = getattr(func, "__name__", "")
            if name in VALUE_READS:
                self.value_reads += name in SCALAR_READS
                if tensor.device.type == self.device_type:
                    self.stacks.append(_stack_here(1))
            elif name in HOST_COPIES and _copies_to_host(name, tensor, args, kwargs):
                self.stacks.append(_stack_here(1))
        return func(*args, **kwargs)


def name_host_reads(stacks: Iterable[Sequence[Frame]], *, unseen: int = 0) -> HostSyncs:
    """Sorts host reads by their stacks (innermost first); ``unseen`` reads had no Python call.

    The innermost frame outside torch decides: the training code's is named as it is. In Lightning,
    the flush to the loggers (every ``log_every_n_steps``, not every step) is counted apart, the
    conversion of progress-bar metrics (every batch) is named as such, and anything else is
    Lightning's own read (per batch, or periodic such as a checkpoint every N steps: one interval
    cannot tell).
    """
    result = HostSyncs(unseen=unseen)
    sites: collections.Counter[str] = collections.Counter()
    lightning: collections.Counter[str] = collections.Counter()
    for stack in stacks:
        frames = [frame for frame in stack if frame.package != "torch"]
        if not frames:
            sites["(no Python frame)"] += 1
            continue
        first, functions = frames[0], {frame.function for frame in frames}
        if first.package not in FRAMEWORK_MODULES:
            sites[first.where] += 1
        elif functions & LOGGER_FLUSH_FRAMES:
            result.periodic += 1
        elif PROGRESS_BAR_FRAME in functions:
            result.progress_bar += 1
        else:
            lightning[first.where] += 1
    result.sites = dict(sites.most_common())
    result.lightning_sites = dict(lightning.most_common())
    result.count = sum(sites.values()) + sum(lightning.values()) + result.progress_bar + unseen
    return result


_RUNNING_PROBES: weakref.WeakSet[BetweenStepsProbe] = weakref.WeakSet()


def _abort_running_probes() -> None:
    """Before a fork (DataLoader workers): a child must not inherit a running profiler or mode. Both
    belong to the thread that started them; a fork from another thread only spoils the result."""
    for probe in list(_RUNNING_PROBES):
        if threading.get_ident() == probe.thread:
            probe.abort()
        else:
            probe.spoiled = True


os.register_at_fork(before=_abort_running_probes)


class BetweenStepsProbe:
    """Looks at the host's work between two training steps for host syncs.

    ``start`` at the very end of a batch (the callback's last act in ``on_train_batch_end``), ``stop``
    at the next callback hook: the next batch's start, or the epoch's end or validation. In between,
    Lightning logs, updates the progress bar and fetches the next batch; a sync there leaves the GPU
    idle every step. The callback does not start one where validation may follow (its DataLoader
    workers would be forked with the probe active).

    Both kinds profile the interval's ATen ops (``torch.profiler``, CPU ops, a few milliseconds) and
    count every ``aten::_local_scalar_dense``. Naming (``name=True``) also records, through a
    ``TorchFunctionMode``, the Python stack of every read of a tensor's value (``.item()``,
    ``float()``, ``bool()``, ``.tolist()``, copies to the CPU); reads the profiler saw that no Python call
    made directly are reported as unseen. It runs after a count found reads.
    """

    def __init__(self) -> None:
        self._profiler: torch.profiler.profile | None = None
        self._recorder: _HostReadRecorder | None = None
        self.processing_seconds = 0.0
        self.aborted = False  # stopped without a result since the last start
        self.thread = 0  # the thread that started it (profiler sessions and function modes are per thread)
        self.spoiled = False  # a fork from another thread happened while it ran

    @property
    def active(self) -> bool:
        return self._profiler is not None

    def start(self, *, name: bool, device_type: str) -> bool:
        if self._profiler is not None:
            return False
        self.aborted = False
        profiler = _start_cpu_profiler()
        if profiler is None:
            return False
        self._profiler = profiler
        self.thread, self.spoiled = threading.get_ident(), False
        if name:
            self._recorder = _HostReadRecorder(device_type)
            self._recorder.__enter__()
        _RUNNING_PROBES.add(self)
        return True

    def _end(self) -> torch.profiler.profile:
        """Stops the mode and the profiler, whatever either raises."""
        _RUNNING_PROBES.discard(self)
        recorder, self._recorder = self._recorder, None
        profiler, self._profiler = self._profiler, None
        try:
            if recorder is not None:
                recorder.__exit__(None, None, None)
        finally:
            with _native_stderr_silenced():
                profiler.stop()
        return profiler

    def abort(self) -> None:
        """Stops without a result: the interval held more than the work between two steps."""
        if self._profiler is None:
            return
        self._end()
        self.aborted = True

    def stop(self) -> HostSyncs | None:
        if self._profiler is None:
            return None
        if self.spoiled:  # another thread forked meanwhile: the interval is not a plain one
            self.abort()
            return None
        started = time.perf_counter()
        recorder = self._recorder
        profiler = self._end()
        reads = sum(1 for event in profiler.events() if event.name == HOST_SYNC_OP)
        if recorder is not None:
            syncs = name_host_reads(recorder.stacks, unseen=max(0, reads - recorder.value_reads))
        else:
            syncs = HostSyncs(count=reads, named=False)
        self.processing_seconds += time.perf_counter() - started
        return syncs


def host_sync_advice(syncs: HostSyncs | None, in_step: int) -> list[str]:
    """What to change, one sentence per cause, for the syncs of a step and of the interval after it."""
    advice = []
    if syncs is not None and syncs.progress_bar:
        advice.append(
            "Lightning converts every metric logged with `prog_bar=True` in `training_step` to a Python "
            "number after each batch. On a GPU that is a host sync per step: the GPU idles while the host "
            "prepares the next step, which a compiled step, being shorter, feels more. Log step metrics "
            "with `prog_bar=False` (the loggers still get them every `log_every_n_steps`), or show them "
            "only at epoch end (`on_step=False, on_epoch=True`)."
        )
    if syncs is not None and syncs.sites:
        where = "; ".join(f"{site} (x{n})" for site, n in syncs.sites.items())
        advice.append(
            f"{sum(syncs.sites.values())} host read(s) of a tensor's value between steps: {where}. Each "
            f"makes the host wait for the GPU; keep such values on the device or read them every N steps."
        )
    if syncs is not None and syncs.unseen:
        advice.append(
            f"{syncs.unseen} host read(s) between steps made inside another torch call (formatting, printing "
            f"or comparing a tensor, boolean-mask indexing), so no line can be named; look for those in "
            f"the hooks that run after each batch."
        )
    if syncs is not None and syncs.lightning_sites:
        where = "; ".join(f"{site} (x{n})" for site, n in syncs.lightning_sites.items())
        advice.append(
            f"Lightning itself reads {sum(syncs.lightning_sites.values())} value(s) on the host between "
            f"steps: {where} (e.g. the SIGTERM flag it broadcasts every batch under multi-process "
            f"strategies). The training code cannot turn these off; they cost most where the step is short."
        )
    if in_step:
        advice.append(
            f"`training_step` and its backward read {in_step} tensor value(s) on the host per step "
            f"(`.item()`, `float()`, `bool()` or a Python `if` on a tensor): each is a host sync, and inside "
            f"a compiled region also a graph break. Keep the value on the device (`torch.where`, logging "
            f"the tensor itself)."
        )
    return advice


def graph_coverage(eager_now: int, eager_reference: int) -> float | None:
    """S = the share of the fully eager step's ops that now run inside compiled graphs."""
    if eager_reference <= 0:
        return None
    return min(1.0, max(0.0, 1.0 - eager_now / eager_reference))


def split_library_calls(calls: dict[str, int]) -> tuple[dict[str, int], dict[str, int]]:
    """``(fallbacks, extern)``: ATen fallback kernels (ops Inductor could not lower) and the library
    kernels Inductor chose (cuBLAS/cuDNN matmuls and convolutions), each by name."""
    fallback_names = torch_internals.inductor_fallback_names()
    fallbacks = {name: n for name, n in calls.items() if name in fallback_names}
    extern = {name: n for name, n in calls.items() if name not in fallback_names}
    return fallbacks, extern


class OpAnatomy:
    """When to sample a step, and what the samples say: the ``compile/anatomy/*`` op figures.

    One eager step is sampled before anything is compiled (the reference of graph coverage); then one
    step of the compiled plan, again whenever the plan or its graph and graph-break counts changed, at
    most once an epoch. Sampled steps are not timed (``take_sampled_batch``).

    Args:
        backend: the ``torch.compile`` backend. Under dynamo's ``"eager"`` backend graphs run as plain
            ATen ops, indistinguishable from graph breaks: no op figures are reported then.
    """

    def __init__(self, backend: str) -> None:
        self.backend = backend
        self.sampler = StepSampler()
        self.probe = BetweenStepsProbe()  # started after a sampled batch, until the next hook
        self._probe_due = False  # a probe is to start at the next batch end that allows one, until one has a result
        self.host_syncs: HostSyncs | None = None  # the latest interval between two steps that was probed
        self._name_syncs_next = False  # reads were counted: the next interval's probe names them
        self.device_type = "cpu"  # the training device's type (set by the callback)
        self.eager: StepOps | None = None  # the fully eager step: the reference of graph coverage
        self.compiled: StepOps | None = None  # the latest sampled step of the current plan
        self._sampling: str | None = None  # "eager" or "compiled" while a step is being sampled
        self._sampled_kind: str | None = None  # what the batch now ending was sampled as
        self._sampled_plan: tuple[Any, ...] | None = None
        self._sampled_epoch = -1
        self._before_sample: tuple[Any, ...] = (None, None, -1)  # restored if a compiled sample is discarded
        self._kernels: tuple[StepOps | None, tuple[dict[str, int], dict[str, int]]] = (None, ({}, {}))

    def before_batch(
        self,
        module: nn.Module,
        *,
        eager_step: bool,
        compiled_step: bool,
        regions: Sequence[Any],
        epoch: int,
        graph_counts: Callable[[], tuple[int, int]],
        region_modules: Callable[[], dict[str, Sequence[nn.Module]]],
    ) -> None:
        """Starts sampling this batch if it is due. ``region_modules()`` gives the modules to mark per
        region in the eager sample; ``graph_counts()`` the (graphs, graph breaks) so far. Both are only
        called when a sample may be due, so a steady step costs a few comparisons."""
        if self.eager is None and eager_step:
            if not any(r.is_compiled for r in regions) and self.sampler.start(module, region_modules()):
                self._sampling = self._sampled_kind = "eager"
        elif compiled_step and self.eager is not None:
            if self.compiled is not None and epoch == self._sampled_epoch:
                return  # sampled this epoch already: a change since is sampled at the next one
            signature = (tuple((r.name, r.compiled_with) for r in regions if r.is_compiled), graph_counts())
            if signature == self._sampled_plan:
                return
            if self.sampler.start(module):
                self._sampling = self._sampled_kind = "compiled"
                self._before_sample = (self.compiled, self._sampled_plan, self._sampled_epoch)
                self._sampled_plan, self._sampled_epoch = signature, epoch

    def backward_started(self) -> None:
        if self._sampling is not None:
            self.sampler.backward_started()

    def backward_ended(self, *, last: bool) -> None:
        """``last``: no other backward follows in this batch (automatic optimization), so the sample
        ends here, before the optimizer step; with manual optimization it ends with the batch."""
        if self._sampling is not None:
            self.sampler.backward_ended()
            if last:
                self.end_sample()

    def end_sample(self) -> None:
        kind, self._sampling = self._sampling, None
        ops = self.sampler.stop()
        if ops is None or kind is None:
            return
        if kind == "eager":
            self.eager = ops
        else:
            self.compiled = ops

    def end_batch(self, *, compiled: bool) -> bool:
        """Ends the batch's sample, if any; returns whether the batch was sampled (and so is no timed
        step). ``compiled``: dynamo compiled during the batch, whose tracing ops are no steady-state
        step's: a compiled sample of such a batch is thrown away and taken again at a later batch.
        After a sampled batch the interval up to the next batch is to be probed for host syncs."""
        self.end_sample()
        kind, self._sampled_kind = self._sampled_kind, None
        if kind == "compiled" and compiled:
            self.compiled, self._sampled_plan, self._sampled_epoch = self._before_sample
        if kind is not None:
            self._probe_due = True
        return kind is not None

    def start_probe_if_due(self, *, allowed: Callable[[], bool]) -> None:
        """Starts the probe of the interval from now to the next batch, if one is due and ``allowed()``
        (not where validation or the epoch's end may follow; asked only when a probe is due: most
        batches have none); call it last at a batch's end."""
        if self._probe_due and allowed():
            self.probe.start(name=self._name_syncs_next, device_type=self.device_type)

    def finish_probe(self) -> HostSyncs | None:
        """Ends the probe of the interval between steps, if one runs; returns what it found once it is
        known. A probe stays due until one gives a result: one cut short (a fork) runs again, and
        reads counted by the profiler are named by the next interval's probe."""
        syncs = self.probe.stop()
        if syncs is None:
            return None
        if not syncs.named and syncs.count:
            self._name_syncs_next = True
            return None
        self.host_syncs = syncs
        self._probe_due = self._name_syncs_next = False
        return syncs

    def abort_probe(self) -> None:
        """Stops the probe without a result (validation or the epoch's end came before the next
        batch: not the interval between two steps); it stays due and runs at a later batch."""
        self.probe.abort()

    def close(self) -> None:
        """Stops whatever profiler runs (a step raised, or fit ended)."""
        self.end_sample()
        self.probe.abort()

    @property
    def step_host_syncs(self) -> int | None:
        """Host syncs of the latest sampled step (the compiled plan's, else the eager reference's)."""
        step = self.compiled or self.eager
        return step.host_syncs if step is not None else None

    def metrics(self, regions: Sequence[Any], decisions: Sequence[Any], compiled_ms: float | None) -> dict[str, float | None]:
        """Graph coverage, fallback kernels, guard cost and host syncs as ``compile/anatomy/*`` scalars."""
        syncs: dict[str, float | None] = {}
        if self.step_host_syncs is not None:
            syncs[telemetry.ANATOMY_HOST_SYNCS_STEP] = float(self.step_host_syncs)
        if self.host_syncs is not None:
            syncs[telemetry.ANATOMY_HOST_SYNCS_BETWEEN] = float(self.host_syncs.count)
        now, reference = self.compiled, self.eager
        if now is None or reference is None or self.backend == "eager":
            return syncs
        fallbacks, _ = self.kernels()
        moved = reference.eager_ops - now.eager_ops  # ops that now run inside compiled graphs
        # Kernels replayed from a CUDA graph leave no op events: what they fall back on cannot be seen.
        inductor = self.backend == "inductor" and not uses_cuda_graphs(regions)
        values: dict[str, float | None] = {
            telemetry.ANATOMY_GRAPH_COVERAGE: graph_coverage(now.eager_ops, reference.eager_ops),
            telemetry.ANATOMY_EAGER_OPS: float(now.eager_ops),
            telemetry.ANATOMY_STEP_OPS: float(reference.eager_ops),
            telemetry.ANATOMY_FALLBACK_CALLS: float(sum(fallbacks.values())) if inductor else None,
            telemetry.ANATOMY_BACKEND_COVERAGE: (
                max(0.0, 1.0 - sum(fallbacks.values()) / moved) if inductor and moved > 0 else None
            ),
            telemetry.ANATOMY_GUARD_CHECKS: float(now.guard_checks),
            telemetry.ANATOMY_GUARD_US_PER_CALL: now.guard_us / now.guard_checks if now.guard_checks else None,
            telemetry.ANATOMY_GUARD_SHARE: now.guard_us / (compiled_ms * 1e3) if compiled_ms else None,
            telemetry.ANATOMY_SAMPLING_S: self.sampler.processing_seconds + self.probe.processing_seconds,
            **syncs,
        }
        for name, coverage in self.region_coverage(regions, decisions).items():
            values[f"compile/region/{telemetry.region_tag(name)}/graph_coverage"] = coverage
        return values

    def kernels(self) -> tuple[dict[str, int], dict[str, int]]:
        """The compiled sample's library calls split into (fallbacks, library kernels), once per sample."""
        if self.compiled is not None and self._kernels[0] is not self.compiled:
            self._kernels = (self.compiled, split_library_calls(self.compiled.library_calls))
        return self._kernels[1]

    def region_coverage(self, regions: Sequence[Any], decisions: Sequence[Any]) -> dict[str, float | None]:
        """Graph coverage per region decided on: 0 for a region that runs eager."""
        if self.compiled is None or self.eager is None or self.backend == "eager":
            return {}
        compiled = {r.name for r in regions if r.is_compiled}
        coverage: dict[str, float | None] = {}
        for decision in decisions:
            name = decision.region
            if name in coverage or name not in self.eager.region_eager_ops:
                continue
            reference = self.eager.region_eager_ops[name]
            now = self.compiled.region_eager_ops.get(name, 0) if name in compiled else reference
            coverage[name] = graph_coverage(now, reference)
        return coverage

    def details(self, regions: Sequence[Any], decisions: Sequence[Any]) -> dict[str, Any]:
        """What the scalars summarize, for the report: kernels by name, eager ops by name, per region."""
        details: dict[str, Any] = {}
        if self.compiled is not None and self.eager is not None and self.backend != "eager":
            fallbacks, extern = self.kernels()
            if uses_cuda_graphs(regions):
                details["kernels_note"] = (
                    "CUDA graphs (reduce-overhead) replay their kernels without op events: the kernels "
                    "below are only those called outside the graphs; backend coverage is not measurable"
                )
            details["fallback_kernels"] = dict(sorted(fallbacks.items(), key=lambda kv: -kv[1]))
            details["library_kernels"] = dict(sorted(extern.items(), key=lambda kv: -kv[1]))
            details["region_graph_coverage"] = self.region_coverage(regions, decisions)
            details["eager_op_names"] = dict(list(self.compiled.eager_op_names.items())[:20])
            details["sampled_step"] = self.compiled.as_dict()
        if self.host_syncs is not None:
            details["host_sync_sites"] = self.host_syncs.all_sites()
            details["host_reads_periodic"] = self.host_syncs.periodic
        if self.eager is not None:
            details["eager_reference_step"] = {
                "eager_ops": self.eager.eager_ops, "region_eager_ops": self.eager.region_eager_ops
            }
        return details
