"""The accuracy rule: is a compiled region's result as close to the truth as eager's own?

Two correct computations of one model differ by their rounding: another summation order, a fused kernel,
bf16 matmuls. So a compiled result is not judged by its distance to eager alone but, as PyTorch judges
its own compiler (``torch._dynamo.utils.same``, used by ``benchmarks/dynamo/common.py``), against a
float64 reference of the same computation, per tensor (outputs, the loss, every gradient):

1. *Close*: ``allclose(compiled, eager, rtol=tol, atol=tol * rms(eager))`` passes at once. PyTorch's
   first step is ``allclose(atol=rtol=tol)``: its absolute ``atol`` would pass a 1% error in any gradient
   smaller than ~0.1, so here it is scaled by the tensor's own RMS. The figure reported beside the
   verdict (``compile/max_rel_error``) is the worst ``||compiled - eager|| / ||eager||``.
2. *The rule*: otherwise ``RMSE(fp64, compiled) <= m * RMSE(fp64, eager) + floor``, with
   ``floor = tol / 10 * min(1, rms) + eps(dtype) * kind_rms``:
   compiled may be ``m`` times further from the truth than eager is (m = 3 in bf16/fp16 and for tensors
   of fewer than 1000 elements, else 2, as in ``same``), plus a floor. PyTorch's floor is ``tol / 10``
   flat; here it is scaled by the tensor's own float64 RMS where that is below 1, which is stricter: a
   gradient of size ~1e-4, 1% off, is caught where ``tol / 10`` would hide it. The second term is one
   rounding unit of the compute dtype at the float64 RMS of the tensor's kind (all outputs, or all
   gradients): the noise a gradient that is zero in exact arithmetic carries in any real computation,
   where eager may happen to come out exactly zero (wav2vec2's key bias: 8.5e-21 eagerly, 3.7e-12
   compiled, its siblings ~1e-2).
3. *Noise*: a tensor eager gets no digit of (``RMSE(fp64, eager) >= rms``: a gradient that is
   analytically zero, ~1e-15 in float64, e.g. a bias right before a BatchNorm) is rounding noise in eager
   and compiled alike, and another summation order makes other noise; there compiled may be
   ``NOISE_MULTIPLIER`` times eager's noise (PyTorch's largest multiplier), still far below its siblings'
   scale, where PyTorch's flat floor accepts anything under 1e-4.

Nothing here imports Lightning or knows about modules: tensors in, verdicts out.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import torch

# ``tol`` by compute dtype. fp32's 1e-3 is PyTorch's training tolerance on CUDA (benchmarks/dynamo); bf16
# keeps 8 mantissa bits, and a gradient summed over a large batch in bf16 can be several percent off.
TOLERANCE = {torch.float32: 1e-3, torch.float64: 1e-6, torch.bfloat16: 5e-2, torch.float16: 1e-2}
MULTIPLIER = 2.0  # fp32: compiled may be twice as far from float64 as eager (torch._dynamo.utils.same)
REDUCED_PRECISION_MULTIPLIER = 3.0  # bf16/fp16, and small tensors, where noise dominates (same source)
SMALL_TENSOR = 1000  # elements under which a tensor gets the larger multiplier (same source)
NOISE_MULTIPLIER = 10.0  # where eager has no correct digit (its ``force_max_multiplier``)
CHUNK = 1 << 24  # elements compared at a time: float64 temporaries of 128 MB


@dataclasses.dataclass(frozen=True)
class Distance:
    """``||actual - expected||`` and ``||expected||`` over the finite entries; ``agree`` is False on a
    shape or NaN/inf pattern mismatch."""

    difference: float
    norm: float
    agree: bool

    @property
    def relative(self) -> float:
        if not self.agree:
            return float("inf")
        if self.norm > 0:
            return self.difference / self.norm
        return 0.0 if self.difference == 0 else float("inf")


def close(actual: torch.Tensor, expected: torch.Tensor, tolerance: float, device: torch.device, found: Distance) -> bool:
    """Whether ``actual`` is within ``tol`` of ``expected`` elementwise, ``atol = tol * rms(expected)`` (step 1),
    with the same NaN/inf pattern (``found``: their :func:`distance`); in float64 chunks on ``device``."""
    if not found.agree:
        return False
    atol = tolerance * found.norm / max(1, expected.numel()) ** 0.5
    outside = torch.zeros((), device=device, dtype=torch.int64)
    for a, e in zip(actual.detach().reshape(-1).split(CHUNK), expected.detach().reshape(-1).split(CHUNK)):
        a, e = a.to(device, non_blocking=True).double(), e.to(device, non_blocking=True).double()
        finite = torch.isfinite(e)
        outside += ((a - e).abs() > atol + tolerance * e.abs()).logical_and(finite).sum()
    return int(outside) == 0


def distance(actual: torch.Tensor, expected: torch.Tensor, device: torch.device) -> Distance:
    """:class:`Distance` of ``actual`` from ``expected``, in float64 chunks on ``device`` (either may sit in
    host memory), summed there and read once."""
    if actual.shape != expected.shape:
        return Distance(float("inf"), 0.0, False)
    sums = torch.zeros(3, device=device, dtype=torch.float64)  # squared difference, squared norm, mismatches
    for a, e in zip(actual.detach().reshape(-1).split(CHUNK), expected.detach().reshape(-1).split(CHUNK)):
        a, e = a.to(device, non_blocking=True).double(), e.to(device, non_blocking=True).double()
        finite = torch.isfinite(e)
        sums[2] += (torch.isfinite(a) != finite).sum()
        a, e = torch.where(finite, a, 0.0), torch.where(finite, e, 0.0)
        sums[0] += torch.linalg.vector_norm(a - e) ** 2
        sums[1] += torch.linalg.vector_norm(e) ** 2
    difference, norm, mismatches = sums.tolist()
    if mismatches:
        return Distance(float("inf"), 0.0, False)
    return Distance(difference**0.5, norm**0.5, True)


def norm(tensor: torch.Tensor, device: torch.device) -> float:
    """``||tensor||`` over its finite entries, in float64 chunks on ``device``."""
    total = torch.zeros((), device=device, dtype=torch.float64)
    for chunk in tensor.detach().reshape(-1).split(CHUNK):
        chunk = chunk.to(device, non_blocking=True).double()
        total += torch.linalg.vector_norm(torch.where(torch.isfinite(chunk), chunk, 0.0)) ** 2
    return float(total) ** 0.5


def multiplier(dtype: torch.dtype, numel: int) -> float:
    """How much further from float64 than eager a compiled tensor may be (``torch._dynamo.utils.same``)."""
    if dtype in (torch.bfloat16, torch.float16) or numel < SMALL_TENSOR:
        return REDUCED_PRECISION_MULTIPLIER
    return MULTIPLIER


@dataclasses.dataclass(frozen=True)
class RuleCheck:
    """One tensor judged by the rule: its RMSEs against the reference and the bound they were held to."""

    name: str
    compiled_rmse: float
    eager_rmse: float
    multiplier: float
    floor: float

    @property
    def bound(self) -> float:
        return self.multiplier * self.eager_rmse + self.floor

    @property
    def passed(self) -> bool:
        return self.compiled_rmse <= self.bound  # False for NaN

    def describe(self) -> str:
        relation = "<=" if self.passed else ">"
        return (f"{self.name}: RMSE against the reference {self.compiled_rmse:.1e} {relation} "
                f"{self.multiplier:g} x eager's {self.eager_rmse:.1e} + {self.floor:.1e}")


def judge(names: Sequence[str], compiled: Sequence[torch.Tensor], eager: Sequence[torch.Tensor],
          reference: Sequence[torch.Tensor], *, judged: Sequence[int], dtype: torch.dtype, tolerance: float,
          device: torch.device) -> list[RuleCheck]:
    """The rule applied to the tensors at the indices ``judged`` (those not close to eager), against
    ``reference`` (float64, or what could be run: see :mod:`compile_callback.verify`)."""
    squares: dict[str, float] = {}
    counts: dict[str, int] = {}
    for name, tensor in zip(names, reference):
        kind = "output" if name == "output" else "grad"
        squares[kind] = squares.get(kind, 0.0) + norm(tensor, device) ** 2
        counts[kind] = counts.get(kind, 0) + tensor.numel()
    eps = torch.finfo(dtype).eps if dtype.is_floating_point else 0.0
    checks = []
    for index in judged:
        size = max(1, reference[index].numel())
        off_compiled = distance(compiled[index], reference[index], device)
        off_eager = distance(eager[index], reference[index], device)
        rms = off_eager.norm / math.sqrt(size)
        compiled_rmse = off_compiled.difference / math.sqrt(size) if off_compiled.agree else float("inf")
        # Where eager is NaN/inf and float64 is not, eager is no yardstick: compiled must be near float64 alone.
        eager_rmse = off_eager.difference / math.sqrt(size) if off_eager.agree else 0.0
        m = NOISE_MULTIPLIER if off_eager.agree and eager_rmse >= rms else multiplier(dtype, size)
        kind = "output" if names[index] == "output" else "grad"
        kind_rms = math.sqrt(squares[kind] / max(1, counts[kind]))
        checks.append(RuleCheck(names[index], compiled_rmse, eager_rmse, m, tolerance / 10 * min(1.0, rms) + eps * kind_rms))
    return checks
