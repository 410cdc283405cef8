"""Verification: does a compiled region compute what eager computes, on a held input?

Mechanism only. The region's modules are called on inputs held from an eager step, once compiled and
once eager, and their outputs and the gradients of their parameters (and of their differentiable
inputs) are compared. Nothing observable changes: gradients come from ``torch.autograd.grad`` (no
``.grad`` is written; the caller may hold the old ones in host memory meanwhile: :func:`in_host_memory`), buffers (BatchNorm statistics)
are restored, both runs draw the same random
numbers (inductor's ``fallback_random``, the same seed; a region with active dropout compiled by Inductor
is verified on a twin, its dropout off: :func:`verify_module`) and the RNG streams are restored afterwards.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import gc
import time
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from compile_callback import torch_internals
from compile_callback.churn import HF_CACHE_FIX
from compile_callback.regions import CompileOptions

try:
    from torch.distributed.tensor import DTensor
except ImportError:  # a torch built without distributed: nothing is sharded
    DTensor = ()  # type: ignore[assignment,misc]

# Max relative error (per tensor ||compiled - eager|| / ||eager||, worst tensor), by compute dtype: fp32
# is the SPEC's 1e-3. In bf16/fp16 two correct computations differ by their own rounding (bf16 keeps 8
# mantissa bits; a gradient summed over a large batch in bf16 can be 10% off), so a tensor past the
# dtype's tolerance there is judged against an fp32 eager reference: compiled must be no further from
# it than eager is, times REDUCED_PRECISION_SLACK, plus one rounding unit of the dtype or the floor below.
TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-6, torch.bfloat16: 5e-2, torch.float16: 1e-2}
REDUCED_PRECISION_SLACK = 2.0
REDUCED_PRECISION_FLOOR = 1e-3
TINY_SCALE = 1e-3  # a tensor whose RMS is under this share of its kind's RMS is judged against that RMS
CHUNK = 1 << 24  # elements compared at a time: float32 temporaries of 64 MB, never a float64 copy
_SEED = 1234


@dataclasses.dataclass
class VerificationResult:
    passed: bool
    max_rel_error: float
    tolerance: float
    where: str  # "output", "grad of <param>", or the error text
    error: str | None = None
    # Host seconds by stage (eager, compiled: its compile included, fp32 reference, comparison), each
    # ended by a device sync: where a trial's set-up batch spends its time (the report's decisions).
    seconds: dict[str, float] = dataclasses.field(default_factory=dict)


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


def _chunks(tensor: torch.Tensor) -> tuple[torch.Tensor, ...]:
    return tensor.detach().reshape(-1).split(CHUNK)


def _difference(actual: torch.Tensor, expected: torch.Tensor, device: torch.device) -> tuple[float, float, bool]:
    """``(||actual - expected||, ||expected||, agree)`` over the finite entries, in float32 chunks on
    ``device`` (either tensor may sit in host memory: see :func:`_offload`), summed there and read once;
    ``agree`` is False on a shape or NaN/inf pattern mismatch."""
    if actual.shape != expected.shape:
        return float("inf"), 0.0, False
    sums = torch.zeros(3, device=device, dtype=torch.float64)  # squared difference, squared scale, mismatches
    for a, e in zip(_chunks(actual), _chunks(expected)):
        a, e = a.to(device, non_blocking=True).float(), e.to(device, non_blocking=True).float()
        finite = torch.isfinite(e)
        sums[2] += (torch.isfinite(a) != finite).sum()
        a, e = torch.where(finite, a, 0.0), torch.where(finite, e, 0.0)
        sums[0] += torch.linalg.vector_norm(a - e).double() ** 2
        sums[1] += torch.linalg.vector_norm(e).double() ** 2
    diff, scale, mismatches = sums.tolist()
    if mismatches:
        return float("inf"), 0.0, False
    return diff**0.5, scale**0.5, True


@dataclasses.dataclass
class TensorError:
    """How far one tensor is from its reference: relative to its own norm, or, where that norm is tiny
    against its kind's (a gradient the loss barely reaches), to the norm it would have at its kind's RMS."""

    name: str
    error: float
    reference_norm: float
    absolute: bool  # judged against its kind's scale, not its own norm

    def describe(self) -> str:
        if self.absolute:
            return f"{self.name} (reference norm {self.reference_norm:.1e} is tiny: error against its kind's scale)"
        return self.name


def _errors(names: list[str], actual: list[torch.Tensor], expected: list[torch.Tensor],
            device: torch.device) -> list[TensorError]:
    """Per-tensor errors of ``actual`` against ``expected`` (compared on ``device``), each floored at its kind's scale."""
    found = [_difference(a, e, device) for a, e in zip(actual, expected)]
    kinds = ["output" if name == "output" else "grad" for name in names]
    rms: dict[str, float] = {}
    for kind in set(kinds):
        squares = sum(scale**2 for (_, scale, ok), k in zip(found, kinds) if k == kind and ok)
        count = sum(e.numel() for e, k in zip(expected, kinds) if k == kind)
        rms[kind] = (squares / count) ** 0.5 if count else 0.0
    errors = []
    for name, kind, reference, (diff, scale, ok) in zip(names, kinds, expected, found):
        if not ok:
            errors.append(TensorError(name, float("inf"), scale, False))
            continue
        floor = TINY_SCALE * rms[kind] * reference.numel() ** 0.5
        denominator = max(scale, floor)
        error = diff / denominator if denominator > 0 else (0.0 if diff == 0 else float("inf"))
        errors.append(TensorError(name, error, scale, scale < floor))
    return errors


def _offload(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Moves a run's results to host memory, so verification never holds two runs' outputs and gradients
    on the GPU (GPT-2's logits alone are 0.8 GB in bf16, 1.6 GB in fp32): its peak is one run's. The
    copies go to pinned memory without waiting (on the H200 pageable ones made 3.7 s of a whole-model
    GPT-2 trial's stall); their values are read back in stream order by :func:`_difference`'s uploads,
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


def _run(
    module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any], take_outputs: Callable[[list[torch.Tensor]], None]
) -> tuple[int, list[torch.Tensor]]:
    """One forward and backward of ``module``: ``take_outputs`` gets the floating outputs (detached)
    before the backward, which then runs with no other reference to them, as in training (a model's
    logits are freed once its loss is computed: GPT-2's are 1.6 GB). Returns the number of outputs and
    the gradients of the parameters and differentiable inputs."""
    torch.manual_seed(_SEED)
    output = module(*args, **kwargs)
    outputs = [t for t in torch_internals.tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    count = len(outputs)
    differentiable = [t for t in outputs if t.requires_grad]
    # The backward starts where training's does, at the scalar (the loss) when the module returns one;
    # otherwise at every differentiable output.
    seeds = [t for t in differentiable if t.numel() == 1] or differentiable
    take_outputs([_local(t.detach()) for t in outputs])
    del output, outputs, differentiable
    wrt = [p for p in module.parameters() if p.requires_grad]
    wrt += [t for t in torch_internals.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
    grads: list[torch.Tensor] = []
    if seeds and wrt:
        generator = torch.Generator(device=seeds[0].device).manual_seed(_SEED)
        weights = [_backward_weights(t, generator) for t in seeds]
        found = torch.autograd.grad(seeds, wrt, grad_outputs=weights, allow_unused=True)
        grads = [_local(g if g is not None else torch.zeros_like(p)) for g, p in zip(found, wrt)]
    return count, grads


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
    rest, a view that needs no memory of the output's size."""
    if tensor.dim() == 0:
        return torch.randn((), generator=generator, device=tensor.device, dtype=tensor.dtype)
    row = torch.randn(tensor.shape[-1], generator=generator, device=tensor.device, dtype=tensor.dtype)
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
    return [m for m in module.modules() if isinstance(m, DROPOUT_TYPES) and m.p > 0 and m.training]


def _draws_random_numbers(module: nn.Module) -> bool:
    """True for a module in training mode with a dropout layer of p > 0 (the random ops models use)."""
    return bool(_active_dropout(module))


def twin_options(module: nn.Module, options: CompileOptions | None) -> dict[str, Any] | None:
    """``torch.compile``'s arguments for the twin :func:`verify_module` verifies ``module`` on, or None
    where it verifies the module's own compiled graph (:meth:`CompileOptions.verification_twin`)."""
    return (options or CompileOptions()).verification_twin() if _draws_random_numbers(module) else None


@contextlib.contextmanager
def dropout_off(module: nn.Module) -> Iterator[None]:
    """Every active dropout layer of ``module`` at p=0 inside the block, its p back afterwards. Covers what
    reads the layer's ``p`` too (Hugging Face's attention passes ``self.dropout.p`` to SDPA)."""
    layers = _active_dropout(module)
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
    """Compares ``module`` (compiled in place) against its eager self on ``args``/``kwargs``.

    Args:
        module: a module compiled with ``nn.Module.compile``; compiled on first call if not yet.
        args, kwargs: the held input.
        context: the training step's forward context (e.g. the precision plugin's autocast).
        tolerance: max relative error allowed; default by compute dtype (:data:`TOLERANCE`).
        options: how ``module`` was compiled (default: ``torch.compile``'s). A module that draws random
            numbers, compiled by Inductor, is verified on a twin compiled from them
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


# Long on purpose: the order of the runs (eager, then compiled) and of what each frees is the memory footprint.
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

    def restore_buffers() -> None:
        with torch.no_grad():
            for name, buffer in module.named_buffers():
                if name in buffers:
                    buffer.copy_(buffers[name])

    def run(*, compiled: bool, take_outputs: Callable[[list[torch.Tensor]], None], fp32: bool = False
            ) -> tuple[int, list[torch.Tensor]]:
        eager = contextlib.nullcontext() if compiled else eager_reference()
        full = torch.autocast(device_type, enabled=False) if fp32 else contextlib.nullcontext()
        lean = lean_reference(device) if fp32 else contextlib.nullcontext()
        randomness = random_draws() if compiled else contextlib.nullcontext()
        try:
            with torch.enable_grad(), eager, full, lean, randomness:
                return _run(module, args, kwargs, take_outputs)
        finally:
            restore_buffers()

    device = next((p.device for p in module.parameters()), torch.device("cpu"))  # where results are compared
    device_type = device.type
    # Inductor draws random numbers its own way; with fallback_random it draws them like eager, so the two
    # runs compare. A region that draws random numbers (active dropout) compiled by Inductor is therefore
    # verified on a twin compiled that way, and trains on its own graph, compiled without it at its next
    # call (CompileOptions.verification_twin); elsewhere the graph verified here is the one the training
    # steps and a warm restart's cache lookups use. Both runs of such a twin have their dropout layers at
    # p=0: with fallback_random Inductor saves what dropout draws for the backward, and more (on the H200
    # BERT's twin with its dropout on took the fit to 15.6 GB against eager's 12.8 and the plan's 14.05).
    # What that leaves unchecked, Inductor's own random numbers, no comparison with eager could check.
    random = _draws_random_numbers(module)
    twin = twin_options(module, options)
    scope = (twin_scope or torch_internals.TwinScope()) if twin is not None else None

    @contextlib.contextmanager
    def random_draws() -> Iterator[None]:
        with contextlib.ExitStack() as stack:
            if random:  # random ops other than dropout layers' (e.g. a drop-path) still draw like eager
                stack.enter_context(torch_internals.fallback_random())
            if scope is not None:
                stack.enter_context(scope.running(module, **twin))
            yield

    @contextlib.contextmanager
    def eager_reference() -> Iterator[None]:
        # With dropout off, compiled regions inside this one (a plan kept before) run eagerly too, or they
        # would compile again for p=0 and count it as their own churn.
        inner = torch.compiler.set_stance("force_eager") if scope is not None else contextlib.nullcontext()
        with torch_internals.eager_for_now(module), inner:
            yield

    quiet = dropout_off(module) if twin is not None else contextlib.nullcontext()
    with torch.random.fork_rng(devices=cuda_devices(module)), context(), quiet:
        dtype = compute_dtype(module)
        limit = tolerance if tolerance is not None else TOLERANCE.get(dtype, 1e-3)
        stage = "eager reference"
        eager_outputs: list[torch.Tensor] = []
        compiled_outputs: list[torch.Tensor] = []
        output_errors: list[TensorError] = []
        # Under autocast a tensor past the tolerance is judged against an fp32 reference (autocast off); a
        # model whose parameters are half precision ("bf16-true") has none to run, so the tolerance decides.
        reduced = autocast_dtype() in (torch.float16, torch.bfloat16) and tolerance is None

        def compare_outputs(outputs: list[torch.Tensor]) -> None:  # on the device, before the backward
            if len(outputs) == len(eager_outputs):
                output_errors.extend(_errors(["output"] * len(outputs), outputs, eager_outputs, device))
            if reduced:  # kept for an fp32 reference, should one be needed
                compiled_outputs.extend(_offload(outputs))

        try:
            # Eager first, its results moved to host memory; then the compiled run, compared where it lies.
            with timed_stage(seconds, "eager", device):
                eager_count, eager_grads = run(compiled=False, take_outputs=lambda ts: eager_outputs.extend(_offload(ts)))
                eager_grads = _offload(eager_grads)
            stage = "compile"
            with timed_stage(seconds, "compiled", device):  # its compile included, and the outputs' comparison
                count, compiled_grads = run(compiled=True, take_outputs=compare_outputs)
        except torch.OutOfMemoryError as error:
            return _out_of_memory(limit, stage, error)
        except Exception as error:  # a backend error must revert the region, not end the run
            if stage == "compile":
                return VerificationResult(False, float("inf"), limit, "compile", torch_internals.describe_error(error)[:300])
            # The held input cannot be replayed eagerly (e.g. HF's DynamicCache, filled by the live step
            # since: "backward through the graph a second time"): unverifiable, so not trusted.
            cache = _hf_cache_in((args, kwargs))
            fix = (f" (it holds a {cache}: {HF_CACHE_FIX})" if cache else
                   f" ({REENTRANT_CHECKPOINT_FIX})" if "use_reentrant=True" in str(error) else "")
            return VerificationResult(False, float("inf"), limit, "verification",
                                      f"the held input could not be replayed eagerly to verify against{fix}: "
                                      f"{torch_internals.describe_error(error)[:300]}")
        if count != eager_count or len(compiled_grads) != len(eager_grads):
            return VerificationResult(False, float("inf"), limit, "output count differs")
        names = [f"grad of {n}" for n, p in module.named_parameters() if p.requires_grad]
        grad_labels = [names[i] if i < len(names) else "grad of input" for i in range(len(compiled_grads))]
        labels = ["output"] * count + grad_labels
        with timed_stage(seconds, "comparison", device):
            errors = output_errors + _errors(grad_labels, compiled_grads, eager_grads, device)
        worst = max(errors, key=lambda e: (e.error != e.error, e.error), default=TensorError("output", 0.0, 0.0, False))
        failing = [e for e in errors if not e.error <= limit]
        if not failing:
            return VerificationResult(True, worst.error, limit, worst.describe())
        if not reduced:
            return VerificationResult(False, worst.error, limit, worst.describe())
        # Reduced precision, some tensor past the dtype's tolerance: two correct bf16 computations can
        # differ that much, so ask an fp32 eager reference which one is off. Only then: its activations
        # are fp32 (and attention may take the math kernel), twice eager's and more (on the H200 a
        # reference on every trial put HF GPT-2's fit 3 GB and ViT-B's 3.5 GB above their eager peaks).
        compiled_all = compiled_outputs + _offload(compiled_grads)
        eager_all = eager_outputs + eager_grads
        del compiled_grads
        stage = "fp32 reference"
        reference_outputs: list[torch.Tensor] = []
        try:
            with timed_stage(seconds, "fp32 reference", device):
                _, reference_grads = run(compiled=False, fp32=True,
                                         take_outputs=lambda ts: reference_outputs.extend(_offload(ts)))
        except torch.OutOfMemoryError as error:
            return _out_of_memory(limit, stage, error)
        reference = reference_outputs + reference_grads
    with timed_stage(seconds, "comparison", device):
        eager_off = _errors(labels, eager_all, reference, device)
        compiled_off = _errors(labels, compiled_all, reference, device)
    failed = further_from_fp32(eager_off, compiled_off, dtype)
    if failed is not None:
        return VerificationResult(False, worst.error, limit, failed)
    at = next((i for i, e in enumerate(errors) if e is worst), None)  # errors and labels align when no output was lost
    against = (f": {compiled_off[at].error:.1e} from fp32, eager {eager_off[at].error:.1e}"
               if at is not None and len(errors) == len(compiled_off) else "")
    return VerificationResult(True, worst.error, limit, f"{worst.describe()} (no further from fp32 than eager{against})")


def further_from_fp32(eager_off: list[TensorError], compiled_off: list[TensorError], dtype: torch.dtype) -> str | None:
    """The reduced-precision rule: the first tensor the compiled run got further from the fp32 reference
    than eager did (times :data:`REDUCED_PRECISION_SLACK`, plus one unit of ``dtype``'s rounding or
    :data:`REDUCED_PRECISION_FLOOR`, the larger), described; None when every tensor is within it.

    The rounding unit matters where eager's own error is tiny: HF BERT's loss on the H200 was 2e-4 from
    fp32 eagerly and 1.7e-3 compiled, both well within one bf16 rounding (7.8e-3), and a floor of 1e-3
    alone rejected that compile in one check of two."""
    floor = max(REDUCED_PRECISION_FLOOR, torch.finfo(dtype).eps)
    for eager_error, compiled_error in zip(eager_off, compiled_off):
        allowed = REDUCED_PRECISION_SLACK * eager_error.error + floor
        if not compiled_error.error <= allowed:
            return (f"{compiled_error.describe()} (further from fp32 than eager: "
                    f"{compiled_error.error:.1e} > {allowed:.1e})")
    return None


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
