"""Verification: does a compiled region compute what eager computes, on a held input?

Mechanism only. The region's modules are called on inputs held from an eager step, once eager and once
compiled, and their outputs and the gradients of their parameters (and of their differentiable inputs)
are judged by :mod:`compile_callback.accuracy`'s rule, with a float64 reference run only where some
tensor is not close to eager. Nothing observable changes: gradients come from ``torch.autograd.grad``
(no ``.grad`` is written; the caller may hold the old ones in host memory meanwhile:
:func:`in_host_memory`), buffers (BatchNorm statistics) are restored, every run draws the same random
numbers (the same seed; a region that draws any is compiled for verification on a twin with Inductor's
``fallback_random``: :func:`verify_module`) and the RNG streams are restored afterwards.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import random
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from compile_callback import accuracy, torch_internals
from compile_callback.churn import HF_CACHE_FIX
from compile_callback.regions import CompileOptions

try:
    import numpy
except ImportError:  # torch runs without numpy: no numpy generator to keep
    numpy = None  # type: ignore[assignment]

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # a torch built without distributed: nothing is sharded
    DTensor = ()  # type: ignore[assignment,misc]

_SEED = 1234


@dataclasses.dataclass
class VerificationResult:
    passed: bool
    max_rel_error: float  # the figure: worst ||compiled - eager|| / ||eager|| over the tensors compared
    tolerance: float
    where: str  # what decided, on which tensor ("output", "grad of <param>", the rule's check), or the error's stage
    error: str | None = None
    # Host seconds by stage (eager, compiled: its compile included, reference, comparison), each
    # ended by a device sync: where a trial's set-up batch spends its time (the report's decisions).
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)
    random: bool = False  # the region drew random numbers: verified on a twin drawing them like eager


def autocast_dtype() -> torch.dtype | None:
    """The dtype autocast runs matmuls in right now (Lightning's ``"bf16-mixed"``, ``"16-mixed"``), or None."""
    for device_type in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    return None


def compute_dtype(module: nn.Module) -> torch.dtype:
    """The dtype ``module`` computes in right now: autocast's if it is on, else the dtype most of its floating
    parameters hold (Lightning's ``precision="bf16-true"`` and ``"16-true"`` cast them, ``"64-true"`` too),
    else float32."""
    mixed = autocast_dtype()
    if mixed is not None:
        return mixed
    elements: collections.Counter[torch.dtype] = collections.Counter()
    for parameter in module.parameters():
        if parameter.is_floating_point():
            elements[parameter.dtype] += parameter.numel()
    return elements.most_common(1)[0][0] if elements else torch.float32


def _offload(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Moves a run's results to host memory, so verification never holds two runs' outputs and gradients
    on the GPU (GPT-2's logits alone are 0.8 GB in bf16, 1.6 GB in fp32): its peak is one run's. The
    copies go to pinned memory without waiting (on the H200 pageable ones made 3.7 s of a whole-model
    GPT-2 trial's stall); their values are read back in stream order by :func:`accuracy.distance`'s uploads,
    never by the host."""
    return [_to_host(t) if t.device.type == "cuda" else t for t in tensors]


def _to_host(tensor: torch.Tensor) -> torch.Tensor:
    host = torch.empty_like(tensor, device="cpu", pin_memory=True)
    host.copy_(tensor, non_blocking=True)
    return host


def release_host_memory() -> None:
    """Gives the pinned host memory that verification's copies left in torch's cache back to the system
    (where this torch has ``torch.accelerator.empty_host_cache``)."""
    empty = getattr(getattr(torch, "accelerator", None), "empty_host_cache", None)
    if empty is not None and torch.cuda.is_available() and torch.cuda.is_initialized():
        empty()


@dataclasses.dataclass
class _Run:
    """What one forward and backward left: its floating outputs' count, the gradients (parameters', then
    differentiable inputs'), and whether its forward drew random numbers (advanced a default generator)."""

    outputs: int
    grads: list[torch.Tensor]
    drew_random: bool
    drew_numpy: bool = False  # from numpy's global generator, in Python


def _seed_host_generators() -> None:
    """Python's and numpy's global generators seeded too: model code draws from them in Python, where
    dynamo breaks the graph and runs it eagerly in every run (HF wav2vec2's SpecAugment masks come from
    ``np.random``), so each run must start them alike."""
    random.seed(_SEED)
    if numpy is not None:
        numpy.random.seed(_SEED)


@contextlib.contextmanager
def host_generators_kept() -> Iterator[None]:
    """Python's and numpy's global generator states as they were before the block (``fork_rng`` keeps torch's)."""
    python_state = random.getstate()
    numpy_state = numpy.random.get_state() if numpy is not None else None
    try:
        yield
    finally:
        random.setstate(python_state)
        if numpy is not None:
            numpy.random.set_state(numpy_state)


def _same_numpy_state(a: Any, b: Any) -> bool:
    return a[0] == b[0] and a[2:] == b[2:] and bool((a[1] == b[1]).all())


def _generator_states(devices: Sequence[int]) -> list[torch.Tensor]:
    return [torch.get_rng_state(), *(torch.cuda.get_rng_state(d) for d in devices)]


def _run(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
         take_outputs: Callable[[list[torch.Tensor]], None], *, state: dict[str, torch.Tensor] | None = None) -> _Run:
    """One forward and backward of ``module`` (with ``state``, its parameters and buffers by name, in their
    stead: :func:`torch.func.functional_call`): ``take_outputs`` gets the floating outputs (detached)
    before the backward, which then runs with no other reference to them, as in training (a model's
    logits are freed once its loss is computed: GPT-2's are 1.6 GB).

    Whether the forward drew random numbers is read off the default generators (CPU and the module's
    CUDA devices): any random op advances them, whatever module or function calls it (``nn.Dropout``,
    timm's ``DropPath``, a ``torch.rand`` mask, SDPA's dropout), so none is missed for not being a
    known layer."""
    torch.manual_seed(_SEED)
    _seed_host_generators()
    devices = cuda_devices(module)
    before = _generator_states(devices)
    numpy_before = numpy.random.get_state() if numpy is not None else None
    if state is None:
        output = module(*args, **kwargs)
        parameters = [p for p in module.parameters() if p.requires_grad]
    else:
        output = torch.func.functional_call(module, state, args, kwargs)
        names = {name for name, _ in module.named_parameters()}
        parameters = [t for name, t in state.items() if name in names and t.requires_grad]
    drew = any(not torch.equal(a, b) for a, b in zip(before, _generator_states(devices)))
    numpy_drew = numpy is not None and not _same_numpy_state(numpy_before, numpy.random.get_state())
    outputs = [t for t in torch_internals.tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    count = len(outputs)
    differentiable = [t for t in outputs if t.requires_grad]
    # The backward starts where training's does, at the scalar (the loss) when the module returns one;
    # otherwise at every differentiable output.
    seeds = [t for t in differentiable if t.numel() == 1] or differentiable
    take_outputs([_local(t.detach()) for t in outputs])
    del output, outputs, differentiable
    wrt = parameters + [t for t in torch_internals.tree_leaves((args, kwargs))
                        if isinstance(t, torch.Tensor) and t.requires_grad]
    grads: list[torch.Tensor] = []
    if seeds and wrt:
        generator = torch.Generator(device=seeds[0].device).manual_seed(_SEED)
        weights = [_backward_weights(t, generator) for t in seeds]
        found = torch.autograd.grad(seeds, wrt, grad_outputs=weights, allow_unused=True)
        grads = [_local(g if g is not None else torch.zeros_like(p)) for g, p in zip(found, wrt)]
    return _Run(count, grads, drew, numpy_drew)


def run_forward_and_backward(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """One forward and backward of ``module`` as verification runs them, results dropped (grad mode on)."""
    with torch.enable_grad():
        _run(module, args, kwargs, lambda outputs: None)


def _local(tensor: torch.Tensor) -> torch.Tensor:
    """A sharded tensor's own shard (FSDP2's ``DTensor`` parameters and gradients), any other as it is:
    each rank compares its shard, so verifying a sharded model gathers nothing (whether every rank's
    shard agrees is the planner's ``agree_all``)."""
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def _backward_weights(tensor: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Random weights for an output's gradient: random along its last dimension and expanded over the
    rest, a view that needs no memory of the output's size. Drawn in float32 whatever the output's
    dtype, so every run (bf16, float32, the float64 reference) weighs its outputs alike."""
    shape = tensor.shape[-1:] if tensor.dim() else ()
    row = torch.randn(shape, generator=generator, device=tensor.device, dtype=torch.float32).to(tensor.dtype)
    return row.expand(tensor.shape)


@contextlib.contextmanager
def in_host_memory(tensors: Sequence[torch.Tensor]) -> Iterator[None]:
    """Moves the GPU memory of ``tensors`` to the host while the block runs, and back.

    Verification runs between two training steps, where the previous step's gradients are still alive
    (Lightning sets them to None only after the next forward) and the optimizer's state waits for the
    next step: neither is read by a forward and backward. Beside verification's own gradients, the old
    ones were one model's gradients above the eager peak (HF GPT-2 124M: 0.47 GB on the H200). Each
    storage is emptied and refilled in place (``resize_``), so every tensor keeps its identity, its
    views (DDP's bucket views) and its values. A storage that cannot be resized stays where it is
    (:func:`parkable`).
    """
    storages: dict[int, torch.UntypedStorage] = {}
    for tensor in tensors:
        if tensor.is_cuda and parkable(tensor.untyped_storage()):
            storages.setdefault(tensor.untyped_storage().data_ptr(), tensor.untyped_storage())
    parked: list[tuple[torch.UntypedStorage, torch.Tensor]] = []
    try:
        for storage in storages.values():
            # Pinned, without waiting: the freed device block is reused only by work queued after the copy.
            host = torch.empty(storage.nbytes(), dtype=torch.uint8, pin_memory=True)
            host.copy_(_bytes(storage), non_blocking=True)
            storage.resize_(0)
            parked.append((storage, host))
        yield
    finally:
        for storage, host in parked:
            storage.resize_(host.numel())
            _bytes(storage).copy_(host, non_blocking=True)


def parkable(storage: torch.UntypedStorage) -> bool:
    """Whether :func:`in_host_memory` may empty ``storage`` and refill it: it holds bytes and can be
    resized. Tensors a CUDA graph's replay returned (a trial's gradients, left in ``.grad`` after a
    CUDA-graph trial that was not kept) live in the graph's pool, in storages that cannot be resized:
    on the H200 one ended a BERT fit ("Trying to resize storage that is not resizable")."""
    return bool(storage.nbytes()) and storage.resizable()


def optimizer_state_tensors(optimizers: Sequence[torch.optim.Optimizer]) -> list[torch.Tensor]:
    """The tensors of the optimizers' state (Adam's moments: twice the parameters' memory)."""
    return [value for optimizer in optimizers for state in optimizer.state.values()
            for value in state.values() if isinstance(value, torch.Tensor)]


def _bytes(storage: torch.UntypedStorage) -> torch.Tensor:
    return torch.empty(0, dtype=torch.uint8, device=storage.device).set_(storage)


HOST_MARGIN_BYTES = 4 * 2**30  # host memory left to everything else when the reference pins its activations


def _host_available_bytes() -> int | None:
    """The host memory the kernel says is available (Linux ``MemAvailable``); None where unknown."""
    try:
        with open("/proc/meminfo") as meminfo:
            for line in meminfo:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        return None
    return None


def pin_reference(device: torch.device) -> bool:
    """Whether the fp32 reference's saved activations may go to pinned host memory: where the host has
    room for twice the fit's peak device memory so far (fp32 activations are at most twice a reduced
    precision step's) and :data:`HOST_MARGIN_BYTES` more. Pageable copies made the reference 17 s of
    GPT-2's 22 s verification on the H200; HF GPT-2's reference alone took 10-12 s pageable, 7.9 s
    pinned the first time (allocating the pinned blocks) and 0.67 s once they were in torch's pinned
    cache. Their memory goes back with :func:`release_host_memory` when the search ends."""
    available = _host_available_bytes()
    return available is not None and available >= 2 * torch.cuda.max_memory_allocated(device) + HOST_MARGIN_BYTES


@contextlib.contextmanager
def lean_reference(device: torch.device) -> Iterator[None]:
    """The fp32 reference run's memory kept near the eager step's: the activations autograd saves go to
    host memory (pinned where the host has room: :func:`pin_reference`), and cuDNN picks its algorithms by
    heuristics instead of benchmarking new fp32 shapes (on the H200 that search alone put a ResNet-18
    CIFAR fit at 4.2 GB against 0.37 GB eager)."""
    if device.type != "cuda":
        yield
        return
    cudnn = torch.backends.cudnn
    with torch.autograd.graph.save_on_cpu(pin_memory=pin_reference(device)), cudnn.flags(
        enabled=cudnn.enabled, benchmark=False, deterministic=cudnn.deterministic, allow_tf32=cudnn.allow_tf32
    ):
        yield


DROPOUT_TYPES = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)


def _active_dropout(module: nn.Module) -> list[nn.Module]:
    """Dropout layers of ``module`` that draw now (training, p > 0). Only an optimisation: verification
    sets them to p=0 in every run (:func:`dropout_off`); what draws random numbers is found by the draws
    themselves (:func:`_run`)."""
    return [m for m in module.modules() if isinstance(m, DROPOUT_TYPES) and m.p > 0 and m.training]


def twin_options(random: bool, options: CompileOptions | None) -> dict[str, Any] | None:
    """``torch.compile``'s arguments for the twin :func:`verify_module` verifies a region on, where it
    draws random numbers (``random``), or None where it verifies the module's own compiled graph
    (:meth:`CompileOptions.verification_twin`)."""
    return (options or CompileOptions()).verification_twin() if random else None


@contextlib.contextmanager
def dropout_off(layers: Sequence[nn.Module]) -> Iterator[None]:
    """Every dropout layer of ``layers`` at p=0 inside the block, its p back afterwards. Covers what
    reads the layer's ``p`` too (Hugging Face's attention passes ``self.dropout.p`` to SDPA)."""
    kept = [layer.p for layer in layers]
    for layer in layers:
        layer.p = 0.0
    try:
        yield
    finally:
        for layer, p in zip(layers, kept):
            layer.p = p


def cuda_devices(module: nn.Module) -> list[int]:
    """The CUDA devices whose RNG state a call of ``module`` may advance (restored by fork_rng)."""
    return sorted({p.device.index or 0 for p in module.parameters() if p.device.type == "cuda"})


# Called with each stage's name as it starts, where set: a background child sets it to write its progress
# into its log, which the run reads when a fit ends before the child does (what it was doing, and since when).
stage_started: Callable[[str], None] | None = None


@contextlib.contextmanager
def timed_stage(seconds: dict[str, float], stage: str, device: torch.device) -> Iterator[None]:
    """Adds the host seconds of the block to ``seconds[stage]``, the device's queued work included."""
    if stage_started is not None:
        stage_started(stage)
    started = time.perf_counter()
    try:
        yield
    finally:
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        seconds[stage] = seconds.get(stage, 0.0) + time.perf_counter() - started


def verify_module(
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    tolerance: float | None = None,
    options: CompileOptions | None = None,
    twin_scope: torch_internals.TwinScope | None = None,
) -> VerificationResult:
    """Compares ``module`` (compiled in place) against its eager self on ``args``/``kwargs``, by
    :mod:`compile_callback.accuracy`'s rule.

    Args:
        module: a module compiled with ``nn.Module.compile``; compiled on first call if not yet.
        args, kwargs: the held input.
        context: the training step's forward context (e.g. the precision plugin's autocast).
        tolerance: the rule's ``tol``; default by compute dtype (:data:`accuracy.TOLERANCE`).
        options: how ``module`` was compiled (default: ``torch.compile``'s). A module whose eager run
            draws random numbers, compiled by Inductor, is verified on a twin compiled from them
            (:meth:`CompileOptions.verification_twin`); its own compiled call compiles at its next call.
        twin_scope: the twin shared by the modules of one region (one compile for all; default: its own).

    Returns:
        The result, with the seconds of each stage; errors raised by the compiled call are returned as a
        failed result, not raised.
    """
    seconds: dict[str, float] = {}
    result = _verify_module(module, args, kwargs, context=context, tolerance=tolerance, options=options,
                            twin_scope=twin_scope, seconds=seconds)
    return dataclasses.replace(result, seconds=seconds)


# Verification takes gradients with torch.autograd.grad (nothing written to .grad), which reentrant
# activation checkpointing refuses; the non-reentrant kind, torch's recommended one, verifies.
REENTRANT_CHECKPOINT_FIX = (
    "verification takes gradients with torch.autograd.grad, which reentrant activation checkpointing refuses: "
    "checkpoint with use_reentrant=False (torch.utils.checkpoint.checkpoint(..., use_reentrant=False); Hugging "
    "Face: model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={'use_reentrant': False}))")


def _hf_cache_in(value: Any) -> str | None:
    """The class name of a Hugging Face key/value cache inside a held input (lists, tuples, dicts), or None.

    The input holds it by reference: the live step has filled it with every layer's keys and values since,
    so a replay appends to tensors whose graph that step's backward freed.
    """
    if isinstance(value, (list, tuple)):
        return next(filter(None, map(_hf_cache_in, value)), None)
    if isinstance(value, dict):
        return next(filter(None, map(_hf_cache_in, value.values())), None)
    kind = type(value)
    return kind.__name__ if kind.__module__.startswith("transformers.cache_utils") else None


def float64_state(module: nn.Module) -> dict[str, torch.Tensor]:
    """Float64 copies of ``module``'s floating parameters and buffers, by name, for
    :func:`torch.func.functional_call`: the module's own tensors are never touched (swapping a parameter's
    ``data`` to another dtype would drop its gradient accumulator, and the hooks on it: DDP's all-reduce)."""
    state: dict[str, torch.Tensor] = {}
    for name, tensor in (*module.named_parameters(), *module.named_buffers()):
        if isinstance(tensor, DTensor):
            raise _NoFloat64("its parameters are sharded (DTensor)")
        if tensor.is_floating_point():
            state[name] = tensor.detach().to(torch.float64).requires_grad_(tensor.requires_grad)
    return state


class _NoFloat64(Exception):
    """The float64 reference cannot run for this module."""


def _widened(value: Any) -> Any:
    if isinstance(value, torch.Tensor) and value.is_floating_point() and value.dtype != torch.float64:
        return value.detach().to(torch.float64).requires_grad_(value.requires_grad)
    return value


# Long on purpose: the order of the runs (eager, compiled, then a reference only where needed) and of what
# each frees is the memory footprint.
def _verify_module(
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    context: Callable[[], contextlib.AbstractContextManager],
    tolerance: float | None,
    options: CompileOptions | None,
    twin_scope: torch_internals.TwinScope | None,
    seconds: dict[str, float],
) -> VerificationResult:
    buffers = {name: buffer.detach().clone() for name, buffer in module.named_buffers()}
    device = next((p.device for p in module.parameters()), torch.device("cpu"))  # where results are compared
    # Random numbers: eager and compiled must draw the same ones to compare. Inductor draws its own way,
    # and with fallback_random like eager; so a region whose eager run drew any (found by the draws
    # themselves, :func:`_run`) is verified on a twin compiled that way with the same seed, and trains on
    # its own graph, compiled without it at its next call (CompileOptions.verification_twin). Dropout
    # layers are set to p=0 in every run first: with fallback_random Inductor saves what dropout draws for
    # the backward, and more (BERT's twin with its dropout on took the fit to 15.6 GB against eager's 12.8).
    # What a twin leaves unchecked, Inductor's own random numbers, no comparison with eager could check.
    dropout = _active_dropout(module)
    draws = bool(dropout)
    numpy_draws = False
    scope: torch_internals.TwinScope | None = None
    twin: dict[str, Any] | None = None

    def run(kind: str, take_outputs: Callable[[list[torch.Tensor]], None]) -> _Run:
        with contextlib.ExitStack() as stack:
            stack.enter_context(torch.enable_grad())
            if kind == "compiled":
                if draws:
                    stack.enter_context(torch_internals.fallback_random())
                if numpy_draws:  # numpy draws them in the compiled run too, as in eager
                    stack.enter_context(torch_internals.numpy_draws_in_numpy())
                if scope is not None:
                    stack.enter_context(scope.running(module, **twin))
            else:  # compiled regions inside this one (a plan kept before) run eagerly too
                stack.enter_context(torch_internals.eager_for_now(module))
                stack.enter_context(torch.compiler.set_stance("force_eager"))
            if kind.startswith("reference"):
                stack.enter_context(torch.autocast(device.type, enabled=False))
                stack.enter_context(lean_reference(device))
            try:
                if kind == "reference float64":
                    state = float64_state(module)
                    stack.callback(torch.set_default_dtype, torch.get_default_dtype())
                    torch.set_default_dtype(torch.float64)
                    if draws:  # the float32 run's numbers, widened (a generator draws others in float64)
                        stack.enter_context(torch_internals.random_draws_in_float32())
                    return _run(module, *torch_internals.tree_map(_widened, (args, kwargs)), take_outputs, state=state)
                return _run(module, args, kwargs, take_outputs)
            finally:
                with torch.no_grad():
                    for name, buffer in module.named_buffers():
                        if name in buffers:
                            buffer.copy_(buffers[name])

    with torch.random.fork_rng(devices=cuda_devices(module)), host_generators_kept(), context(), dropout_off(dropout):
        dtype = compute_dtype(module)
        limit = tolerance if tolerance is not None else accuracy.TOLERANCE.get(dtype, 1e-3)
        stage = "eager reference"
        eager_outputs: list[torch.Tensor] = []
        compiled_outputs: list[torch.Tensor] = []
        try:
            # Eager first, then the compiled run; their outputs go to host memory as each backward starts.
            with timed_stage(seconds, "eager", device):
                eager = run("eager", lambda ts: eager_outputs.extend(_offload(ts)))
                eager.grads = _offload(eager.grads)
            numpy_draws = eager.drew_numpy
            draws = draws or eager.drew_random or numpy_draws
            twin = twin_options(draws, options)
            scope = (twin_scope or torch_internals.TwinScope()) if twin is not None else None
            stage = "compile"
            with timed_stage(seconds, "compiled", device):  # its compile included
                compiled = run("compiled", lambda ts: compiled_outputs.extend(_offload(ts)))
        except torch.OutOfMemoryError as error:
            return _out_of_memory(limit, stage, error)
        except Exception as error:  # a backend error must revert the region, not end the run
            if stage == "compile":
                return VerificationResult(False, float("inf"), limit, "compile",
                                          torch_internals.describe_error(error)[:300], random=draws)
            # The held input cannot be replayed eagerly (e.g. HF's DynamicCache, filled by the live step
            # since: "backward through the graph a second time"): unverifiable, so not trusted.
            cache = _hf_cache_in((args, kwargs))
            fix = (f" (it holds a {cache}: {HF_CACHE_FIX})" if cache else
                   f" ({REENTRANT_CHECKPOINT_FIX})" if "use_reentrant=True" in str(error) else "")
            return VerificationResult(False, float("inf"), limit, "verification",
                                      f"the held input could not be replayed eagerly to verify against{fix}: "
                                      f"{torch_internals.describe_error(error)[:300]}")
        if compiled.outputs != eager.outputs or len(compiled.grads) != len(eager.grads):
            return VerificationResult(False, float("inf"), limit, "output count differs", random=draws)
        names = [f"grad of {n}" for n, p in module.named_parameters() if p.requires_grad]
        labels = ["output"] * eager.outputs + [names[i] if i < len(names) else "grad of input"
                                                for i in range(len(compiled.grads))]
        compiled_all = compiled_outputs + compiled.grads
        eager_all = eager_outputs + eager.grads
        del compiled
        with timed_stage(seconds, "comparison", device):
            found = [accuracy.distance(c, e, device) for c, e in zip(compiled_all, eager_all)]
            relative = [distance.relative for distance in found]
            judged = [i for i, (c, e, distance) in enumerate(zip(compiled_all, eager_all, found))
                      if not accuracy.close(c, e, limit, device, distance)]
        worst = max(range(len(relative)), key=lambda i: (relative[i] != relative[i], relative[i]), default=None)
        figure = relative[worst] if worst is not None else 0.0
        if not judged:
            where = f"{labels[worst]} (every tensor within {limit:.0e} of eager)" if worst is not None else "output"
            return VerificationResult(True, figure, limit, where, random=draws)
        # Some tensor is not close to eager: ask a float64 reference which of the two is off (its
        # activations go to host memory: lean_reference), where one can run; else float32 with autocast
        # off, where the region computes in bf16/fp16.
        compiled_all = _offload(compiled_all)
        reference_outputs: list[torch.Tensor] = []
        reference, used, why_not = None, "", ""
        for used in ("float64", "float32"):
            if used == "float32" and dtype not in (torch.bfloat16, torch.float16):
                break
            reference_outputs.clear()
            try:
                with timed_stage(seconds, f"{used} reference", device):
                    reference = run(f"reference {used}", lambda ts: reference_outputs.extend(_offload(ts)))
                break
            except torch.OutOfMemoryError:
                why_not = f"out of memory ({release_device_memory()})"
            except Exception as error:  # e.g. a model that mixes in float32 tensors of its own
                why_not = torch_internals.describe_error(error)[:200]
        if reference is None:
            return VerificationResult(False, figure, limit, f"{labels[judged[0]]}: {relative[judged[0]]:.1e} from eager, "
                                      f"past {limit:.0e}, and no reference could be run to judge it ({why_not})",
                                      random=draws)
        against = f"a {used} reference" + (f" (float64 could not run: {why_not})" if used == "float32" else "")
    with timed_stage(seconds, "comparison", device):
        checks = accuracy.judge(labels, compiled_all, eager_all, reference_outputs + _offload(reference.grads),
                                judged=judged, dtype=dtype, tolerance=limit, device=device)
    failed = next((check for check in checks if not check.passed), None)
    if failed is not None:
        return VerificationResult(False, figure, limit, f"{failed.describe()} (PyTorch's accuracy rule, against {against})",
                                  random=draws)
    closest = max(checks, key=lambda check: check.compiled_rmse / check.bound if check.bound else 0.0)
    return VerificationResult(True, figure, limit, f"{len(checks)} tensor(s) past {limit:.0e} of eager pass PyTorch's "
                              f"accuracy rule against {against} (closest: {closest.describe()})", random=draws)


def _out_of_memory(limit: float, stage: str, error: BaseException) -> VerificationResult:
    """A verification that ran out of device memory: reverted like any failure, its memory handed back."""
    detail = f"{torch_internals.first_line(str(error))[:300]} ({release_device_memory()})"
    where = "compile" if stage == "compile" else "verification"
    return VerificationResult(False, float("inf"), limit, where, f"out of memory during the {stage} run: {detail}")


def release_device_memory() -> str:
    """After an out-of-memory error: hands the allocator's cached blocks back (a reverted region's
    compiled code and CUDA-graph pool go with it once nothing holds them) and says what is free."""
    gc.collect()
    if not torch.cuda.is_available() or not torch.cuda.is_initialized():
        return "no CUDA device"
    torch.cuda.empty_cache()
    free, total = torch.cuda.mem_get_info()
    return f"{free / 2**30:.1f} of {total / 2**30:.1f} GB free after freeing"
