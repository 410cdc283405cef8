"""Verification: does a compiled region compute what eager computes, on a held input?

Mechanism only. The region's modules are called on inputs held from an eager step, once compiled and
once eager, and their outputs and the gradients of their parameters (and of their differentiable
inputs) are compared. Nothing observable changes: gradients come from ``torch.autograd.grad`` (no
``.grad`` is touched), buffers (BatchNorm statistics) are restored, both runs draw the same random
numbers (inductor's ``fallback_random``, the same seed) and the RNG streams are restored afterwards.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from typing import Any

import torch
from torch import nn

from compile_callback import torch_internals

# Max relative error (per tensor ||compiled - eager|| / ||eager||, worst tensor), by compute dtype: fp32
# is the SPEC's 1e-3. In bf16/fp16 two correct computations differ by their own rounding (bf16 keeps 8
# mantissa bits; a gradient summed over a large batch in bf16 can be 10% off), so there the test is
# against an fp32 eager reference: compiled must be no further from it than eager is, times
# REDUCED_PRECISION_SLACK, plus the floor below.
TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-6, torch.bfloat16: 5e-2, torch.float16: 1e-2}
REDUCED_PRECISION_SLACK = 2.0
REDUCED_PRECISION_FLOOR = 1e-3
_SEED = 1234


@dataclasses.dataclass
class VerificationResult:
    passed: bool
    max_rel_error: float
    tolerance: float
    where: str  # "output", "grad of <param>", or the error text
    error: str | None = None


def compute_dtype() -> torch.dtype:
    """The dtype matmuls run in right now: the autocast dtype if autocast is on, else float32."""
    for device_type in ("cuda", "cpu"):
        if torch.is_autocast_enabled(device_type):
            return torch.get_autocast_dtype(device_type)
    return torch.float32


def _relative_error(actual: torch.Tensor, expected: torch.Tensor) -> float:
    """Normwise relative error ||actual - expected|| / ||expected||; inf on NaN/inf disagreement."""
    actual, expected = actual.detach().double(), expected.detach().double()
    if actual.shape != expected.shape:
        return float("inf")
    if not torch.equal(torch.isfinite(actual), torch.isfinite(expected)):
        return float("inf")
    finite = torch.isfinite(expected)
    if not finite.any():
        return 0.0
    diff = torch.linalg.vector_norm(actual[finite] - expected[finite]).item()
    scale = torch.linalg.vector_norm(expected[finite]).item()
    return diff / scale if scale > 0 else (0.0 if diff == 0 else float("inf"))


def _run(module: nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    torch.manual_seed(_SEED)
    output = module(*args, **kwargs)
    outputs = [t for t in torch_internals.tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
    differentiable = [t for t in outputs if t.requires_grad]
    wrt = [p for p in module.parameters() if p.requires_grad]
    wrt += [t for t in torch_internals.tree_leaves((args, kwargs)) if isinstance(t, torch.Tensor) and t.requires_grad]
    grads: list[torch.Tensor] = []
    if differentiable and wrt:
        generator = torch.Generator(device=differentiable[0].device).manual_seed(_SEED)
        weights = [torch.randn(t.shape, generator=generator, device=t.device, dtype=t.dtype) for t in differentiable]
        found = torch.autograd.grad(differentiable, wrt, grad_outputs=weights, allow_unused=True)
        grads = [g if g is not None else torch.zeros_like(p) for g, p in zip(found, wrt)]
    return [t.detach() for t in outputs], grads


def _draws_random_numbers(module: nn.Module) -> bool:
    """True for a module in training mode with a dropout layer of p > 0 (the random ops models use)."""
    dropout_types = (nn.Dropout, nn.Dropout1d, nn.Dropout2d, nn.Dropout3d, nn.AlphaDropout, nn.FeatureAlphaDropout)
    return any(isinstance(m, dropout_types) and m.p > 0 and m.training for m in module.modules())


def cuda_devices(module: nn.Module) -> list[int]:
    """The CUDA devices whose RNG state a call of ``module`` may advance (restored by fork_rng)."""
    return sorted({p.device.index or 0 for p in module.parameters() if p.device.type == "cuda"})


def verify_module(
    module: nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    context: Callable[[], contextlib.AbstractContextManager] = contextlib.nullcontext,
    tolerance: float | None = None,
) -> VerificationResult:
    """Compares ``module`` (compiled in place) against its eager self on ``args``/``kwargs``.

    Args:
        module: a module compiled with ``nn.Module.compile``; compiled on first call if not yet.
        args, kwargs: the held input.
        context: the training step's forward context (e.g. the precision plugin's autocast).
        tolerance: max relative error allowed; default by compute dtype (:data:`TOLERANCE`).

    Returns:
        The result; errors raised by the compiled call are returned as a failed result, not raised.
    """
    buffers = {name: buffer.detach().clone() for name, buffer in module.named_buffers()}

    def restore_buffers() -> None:
        with torch.no_grad():
            for name, buffer in module.named_buffers():
                if name in buffers:
                    buffer.copy_(buffers[name])

    with torch.random.fork_rng(devices=cuda_devices(module)), context():
        dtype = compute_dtype()
        limit = tolerance if tolerance is not None else TOLERANCE.get(dtype, 1e-3)
        # Inductor draws random numbers its own way; with fallback_random it draws them like eager, so
        # the two runs compare. It is also part of Inductor's cache key, so it is only turned on for
        # regions that draw random numbers (active dropout): elsewhere the graph verified here is the
        # one the training steps and a warm restart's cache lookups use.
        randomness = torch_internals.fallback_random() if _draws_random_numbers(module) else contextlib.nullcontext()
        try:
            with torch.enable_grad(), randomness:
                compiled_out, compiled_grads = _run(module, args, kwargs)
        except Exception as error:  # a backend error must revert the region, not end the run
            restore_buffers()
            return VerificationResult(False, float("inf"), limit, "compile", torch_internals.describe_error(error))
        restore_buffers()
        with torch.enable_grad(), torch_internals.eager_for_now(module):
            eager_out, eager_grads = _run(module, args, kwargs)
        restore_buffers()
        reference = None
        if dtype in (torch.float16, torch.bfloat16) and tolerance is None:
            device_type = next((p.device.type for p in module.parameters()), "cpu")
            with torch.enable_grad(), torch_internals.eager_for_now(module), torch.autocast(device_type, enabled=False):
                reference = _run(module, args, kwargs)
            restore_buffers()
    if len(compiled_out) != len(eager_out):
        return VerificationResult(False, float("inf"), limit, "output count differs")
    names = [f"grad of {n}" for n, p in module.named_parameters() if p.requires_grad]
    labels = ["output"] * len(compiled_out) + [names[i] if i < len(names) else "grad of input" for i in range(len(compiled_grads))]
    compiled_all, eager_all = compiled_out + compiled_grads, eager_out + eager_grads
    worst, where, passed = 0.0, "output", True
    for index, (label, actual, expected) in enumerate(zip(labels, compiled_all, eager_all)):
        error = _relative_error(actual, expected)
        if error > worst or error != error:
            worst, where = error, label
        if reference is None:
            passed = passed and error <= limit
        else:
            truth = (reference[0] + reference[1])[index]
            allowed = REDUCED_PRECISION_SLACK * _relative_error(expected, truth) + REDUCED_PRECISION_FLOOR
            if _relative_error(actual, truth) > allowed:
                passed, where = False, f"{label} (further from fp32 than eager: > {allowed:.1e})"
    return VerificationResult(passed, worst, limit, where)
