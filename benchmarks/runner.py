"""Runs a workload's variants one after another in this process, on the same data and initial weights.

Each variant gets a fresh module loaded with the same state dict, a fresh dataloader over the same
batches, the same seed, and a dynamo with no compiled code (``torch.compiler.reset()``); it trains for
the same number of steps, and its record holds the measurements of :mod:`benchmarks.measure` and the
counts of :mod:`benchmarks.dynamo_counts`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import sys
import tempfile
import time
import traceback
from collections.abc import Callable
from typing import Any
from unittest import mock

import torch
from lightning.pytorch import LightningDataModule, LightningModule, Trainer

from benchmarks import dynamo_counts
from benchmarks.checks import add_checks
from benchmarks.measure import ChildPauseAB, ChildPauses, InFitAB, StepEnd, StepMeter, StepStart, mfu, speedup
from benchmarks.trace import StepProfile, StepTrace
from benchmarks.variants import (
    VARIANTS,
    Variant,
    apply_compile,
    apply_progress_bar_loss,
    callback_options,
    compile_kwargs,
    make_callback,
    optimizer_compile_kwargs,
    skip_reason,
)
from benchmarks.workloads import Workload
from compile_callback import background, torch_internals
from compile_callback.regions import captures_cuda_graphs


@dataclasses.dataclass(frozen=True)
class RunSettings:
    """How long and where every variant of one workload runs.

    Attributes:
        device: the training device (``cuda`` when there is one).
        smoke: tiny shapes and dynamo's ``eager`` backend (CPU CI).
        total_steps: steps every variant runs; the wall time of these steps is reported.
        measured_steps: the steady-state window, the last ``measured_steps`` steps.
        planned_steps: ``max_steps`` given to the Trainer, the run length the CompileCallback plans
            for (it weighs compile time against the steps left); the run stops after ``total_steps``.
        epoch_steps: steps per epoch (recompiles are counted per epoch); None: one epoch.
        run_dir: where each variant's Trainer writes (``default_root_dir``; the callback's report).
        peak_flops: the device's peak FLOP/s for MFU, None when unknown.
        seed: seeds the weights (already made) and each variant's RNG.
        trace_steps: step cycles traced under ``torch.profiler`` just before the measured window
            (every variant, the plain loop too; :mod:`benchmarks.trace`), written to ``trace_dir``; 0: none.
        longest_steps: the most steps a callback variant may run so that its steady window holds only
            steps after its plan froze (fixed shapes; None: ``total_steps``, the window is only checked).
        in_fit_ab_blocks: blocks of the in-fit A/B a callback variant runs after its steady window
            (fixed shapes; :class:`benchmarks.measure.InFitAB`), ``in_fit_ab_block_steps`` steps each;
            0: none.
        fresh_caches_dir: None: compile caches are off in the whole process (every compile cold, the
            default). A folder: caches on, each variant compiling into an empty Inductor cache of its own
            under it, as on a machine that never compiled this model; a warm cache is then the variant's
            own doing (the CompileCallback's background compile fills one in a child process).
    """

    device: torch.device
    smoke: bool
    total_steps: int
    measured_steps: int
    planned_steps: int
    epoch_steps: int | None
    run_dir: str
    peak_flops: float | None
    seed: int = 0
    trace_steps: int = 0
    trace_dir: str = "."
    longest_steps: int | None = None
    in_fit_ab_blocks: int = 0
    in_fit_ab_block_steps: int = 10
    fresh_caches_dir: str | None = None
    precision: str | None = None  # the Lightning variants' Trainer precision; None: precision_for(device)


def precision_for(device: torch.device) -> str:
    """The Lightning variants' default precision: bf16 autocast on CUDA (the plain loop's too), fp32 on CPU."""
    return "bf16-mixed" if device.type == "cuda" else "32-true"


def precision(settings: RunSettings) -> str:
    return settings.precision or precision_for(settings.device)


def initial_state(workload: Workload, device: torch.device, *, seed: int) -> dict[str, torch.Tensor]:
    """The weights every variant starts from (made once, on the device)."""
    torch.manual_seed(seed)
    with torch.device(device):
        module = workload.build_module()
    return {key: value.detach().clone() for key, value in module.state_dict().items()}


def run_workload(
    workload: Workload,
    variant_names: list[str],
    settings: RunSettings,
    *,
    on_record: Callable[[list[dict[str, Any]]], None] | None = None,
) -> list[dict[str, Any]]:
    """One record per variant, in order; speedups are filled in against the ``eager`` variant.

    ``on_record`` gets the records so far after each variant, so a run cut short by a time limit still
    leaves what it measured.
    """
    cudnn_attention = torch.backends.cuda.cudnn_sdp_enabled()
    torch.backends.cuda.enable_cudnn_sdp(cudnn_attention and workload.cudnn_attention)
    try:
        return _run_variants(workload, variant_names, settings, on_record)
    finally:
        torch.backends.cuda.enable_cudnn_sdp(cudnn_attention)


def _run_variants(
    workload: Workload,
    variant_names: list[str],
    settings: RunSettings,
    on_record: Callable[[list[dict[str, Any]]], None] | None,
) -> list[dict[str, Any]]:
    state = initial_state(workload, settings.device, seed=settings.seed)
    warm_up_process(workload, settings, state)
    records: list[dict[str, Any]] = []
    for name in variant_names:
        print(f"[benchmarks] {workload.name}: {name} ...", file=sys.stderr, flush=True)
        record = run_variant(workload, VARIANTS[name], settings, state)
        records.append(record)
        print(f"[benchmarks] {workload.name}: {name} {_one_line(record)}", file=sys.stderr, flush=True)
        add_speedups(records, by_throughput=workload.cycle_length is not None)
        add_checks(records, by_throughput=workload.cycle_length is not None)
        if on_record is not None:
            on_record(records)
    return records


def warm_up_process(workload: Workload, settings: RunSettings, state: dict[str, torch.Tensor], *, steps: int = 3) -> None:
    """A few eager steps before any variant: CUDA context, cuBLAS/cuDNN handles and cuDNN's algorithm
    search (per shape, process-wide) are paid here, not by whichever variant happens to run first."""
    torch.manual_seed(settings.seed)
    with torch.device(settings.device):
        module = workload.build_module()
    module.load_state_dict(state)
    meter = StepMeter(settings.device, total_steps=steps, measured_steps=1)
    _plain_loop(module, workload.train_loader(steps), meter, workload, settings.device)
    del module, meter
    warm_up_compiler(settings)
    gc.collect()


def warm_up_compiler(settings: RunSettings) -> None:
    """Compiles a tiny forward and backward once, then forgets it: the compiler's one-time start-up
    (imports, the compile worker pool, the C++/Triton toolchain probes; ~10 s on CPU) is then not
    charged to the first compiled variant's compile time."""
    backend = compile_kwargs(VARIANTS["whole"], smoke=settings.smoke)["backend"]
    layer = torch.nn.Linear(16, 16, device=settings.device)
    compiled = torch.compile(layer, backend=backend)
    with autocast_for(settings.device):
        output = compiled(torch.randn(8, 16, device=settings.device))
    output.float().sum().backward()
    dynamo_counts.start_variant()


def run_variant(workload: Workload, variant: Variant, settings: RunSettings, state: dict[str, torch.Tensor]) -> dict[str, Any]:
    """Trains ``variant`` for ``settings.total_steps`` steps and returns its record (never raises)."""
    record: dict[str, Any] = {"workload": workload.name, "variant": variant.name, "description": variant.description}
    reason = skip_reason(variant)
    if reason is not None:
        return {**record, "status": "skipped", "reason": reason}
    # A variant after a callback variant starts once that callback's children (and their compile workers) are
    # gone: a compile left running would slow this variant and flatter the one before it (--pairs).
    record["compile_processes_left"], record["waited_for_compile_processes_s"] = wait_for_compile_processes()
    record["started_at"] = time.time()  # wall clock: matches a concurrent host probe's samples
    try:
        with fresh_compile_cache(settings.fresh_caches_dir, variant.name) as cache_dir, readied_standbys(variant):
            if cache_dir is not None:
                record["compile_cache_dir"] = cache_dir
            record.update(_train_and_measure(workload, variant, settings, state))
        record["status"] = "ok"
    except Exception as error:  # a variant that fails is reported; the others still run
        traceback.print_exc()
        record.update(status="error", error=f"{type(error).__name__}: {str(error).strip()[:2000]}")
    finally:
        record["ended_at"] = time.time()
        gc.collect()
        if settings.device.type == "cuda":
            torch.cuda.empty_cache()
    return record


COMPILE_PROCESSES_WAIT_S = 60.0
CHILD_BOOT = os.path.join("compile_callback", "boot.py")


def compile_processes_of_others() -> list[int]:
    """Processes compiling for another process than this one: a CompileCallback's children and standbys
    (``-m compile_callback.background``, or its ``compile_callback/boot.py`` and the processes that forks) and
    Inductor compile workers whose ``--parent`` is not this process (a child's). Empty where ``/proc`` cannot be
    read (not Linux)."""
    me = os.getpid()
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit() and int(name) != me]
    except OSError:
        return []
    found = []
    for pid in pids:
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as handle:
                arguments = handle.read().decode(errors="replace").split("\0")
        except OSError:  # gone meanwhile, or not ours to read
            continue
        ours = any(a == "compile_callback.background" or a.endswith(CHILD_BOOT) for a in arguments)
        if ours or (any("compile_worker" in a for a in arguments) and f"--parent={me}" not in arguments):
            found.append(pid)
    return found


def wait_for_compile_processes(limit_s: float = COMPILE_PROCESSES_WAIT_S) -> tuple[int, float]:
    """Waits up to ``limit_s`` for :func:`compile_processes_of_others` to end; returns how many are left
    and the seconds waited."""
    started = time.monotonic()
    while (left := len(compile_processes_of_others())) and time.monotonic() - started < limit_s:
        time.sleep(0.2)
    return left, round(time.monotonic() - started, 3)


def readied_standbys(variant: Variant) -> contextlib.AbstractContextManager:
    """While the block runs, a ``next_standby`` variant's callback readies a next child's interpreter at every
    hand-over (:class:`compile_callback.background.Launcher`, as before session 39); others change nothing."""
    if variant.next_standby:
        return mock.patch.object(background, "bytecode_unwritten", lambda: True)
    return contextlib.nullcontext()


@contextlib.contextmanager
def fresh_compile_cache(root: str | None, name: str):
    """Inductor's caches (FX graphs, AOTAutograd, Triton kernels, autotuning) in an empty folder of
    ``root`` while the block runs, for this process and the children it starts; yields the folder, or
    None (and changes nothing) when ``root`` is None. Compiled code in memory is dynamo's, which
    :func:`dynamo_counts.start_variant` forgets; what the folder holds afterwards is left for a look."""
    if root is None:
        yield None
        return
    os.makedirs(root, exist_ok=True)
    directory = tempfile.mkdtemp(prefix=f"{name}-", dir=root)
    previous = torch_internals.use_inductor_cache_dir(directory)
    triton = os.environ.pop("TRITON_CACHE_DIR", None)  # Triton's then follows Inductor's: <directory>/triton
    try:
        yield directory
    finally:
        torch_internals.restore_inductor_cache_dir(previous)
        if triton is not None:
            os.environ["TRITON_CACHE_DIR"] = triton


def _train_and_measure(
    workload: Workload, variant: Variant, settings: RunSettings, state: dict[str, torch.Tensor]
) -> dict[str, Any]:
    device = settings.device
    torch.manual_seed(settings.seed)
    start = dynamo_counts.start_variant()
    if device.type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats(device)
    with torch.device(device):
        module = workload.build_module()
    module.load_state_dict(state)
    apply_progress_bar_loss(variant, module)
    callback = make_callback(variant, smoke=settings.smoke) if variant.callback is not None else None
    # The callback variant's steady window must hold its frozen plan only: it runs on past total_steps
    # (fixed shapes; up to longest_steps) until it does. Variable lengths keep whole epochs.
    longest = settings.longest_steps if callback is not None and settings.epoch_steps is None else None
    before_ab: dict[str, Any] = {}
    in_fit_ab = None
    if callback is not None and settings.epoch_steps is None and settings.in_fit_ab_blocks:
        in_fit_ab = InFitAB(
            _set_eager_stance, blocks=settings.in_fit_ab_blocks, block_steps=settings.in_fit_ab_block_steps,
            on_start=lambda: before_ab.update(_before_ab(callback, device)),
        )
    meter = StepMeter(
        device,
        total_steps=settings.total_steps,
        measured_steps=settings.measured_steps,
        epoch_steps=settings.epoch_steps,
        count_tokens=workload.count_tokens,
        settled=(lambda: plan_frozen(callback) is True) if callback is not None else None,
        longest_steps=longest,
        in_fit_ab=in_fit_ab,
    )
    pauses = ChildPauseAB.within(settings.total_steps, compile_processes_of_others) if variant.pause_child_ab else None
    batches = settings.epoch_steps or meter.longest_steps + (in_fit_ab.steps if in_fit_ab is not None else 0)
    loader = workload.train_loader(batches, pad_to_max=variant.pad_to_max)
    compiled = apply_compile(variant, module, workload.blocks(module), smoke=settings.smoke)
    if variant.optimizer_mode is not None:
        compiled = f"{compiled}; optimizer.step compiled ({variant.optimizer_mode})"
    try:
        if variant.lightning:
            _lightning_fit(module, loader, meter, settings, variant, callback, workload_name=workload.name, pauses=pauses)
        else:
            _plain_loop(module, loader, meter, workload, device, trace=_step_profile(settings, variant, workload.name),
                        optimizer_compile=optimizer_compile_kwargs(variant, smoke=settings.smoke))
    finally:
        if in_fit_ab is not None:
            _set_eager_stance(False)  # a fit that failed inside the A/B leaves no stance to the next variant
        if pauses is not None:
            pauses.resume()  # nothing of a failed fit's stays stopped

    record: dict[str, Any] = {"compiled": compiled}
    # The dtype most of the trained weights held at the end (bf16 under --precision bf16-true, fp32 otherwise).
    record["weights_dtype"] = str(max(module.parameters(), key=lambda p: p.numel()).dtype).replace("torch.", "")
    if callback is not None:
        record["callback_options"] = callback_options(variant, smoke=settings.smoke)
    record.update(meter.result())
    if pauses is not None:
        record["child_pause_ab"] = pauses.summarize(record["step_ends_s"])
    if callback is None:  # every step of a variant without a plan is a steady one
        record.pop("settled_at_step"), record.pop("window_settled")
    else:
        record["plan_frozen_at_step"] = record.pop("settled_at_step")
        record["window_after_plan_frozen"] = record.pop("window_settled")
    counts = dynamo_counts.counts_since(start)
    record["compile_s_dynamo"] = counts.pop("compile_s")
    record["compile_s"] = record["compile_s_dynamo"]
    record["compile_s_source"] = "dynamo compile records"
    record.update(counts)
    if callback is not None:
        report = callback.last_report or {}
        summary = report.get("summary", {})
        if summary.get("compile_time_s") is not None:
            record["compile_s"] = summary["compile_time_s"]
            record["compile_s_source"] = "CompileCallback report"
        record["callback"] = {
            "summary": summary,
            "plan": report.get("plan"),
            "decisions": report.get("decisions", []),
            "suggestions": report.get("suggestions", []),
            "anatomy": report.get("anatomy", {}),
        }
        if before_ab:
            # The A/B's eager steps ran through the callback's hooks after the window: its figures and the
            # peak are taken as they stood when the steady window ended.
            record["callback"]["at_window_end"] = before_ab["reported"]
    if workload.cycle_length is None and record.get("real_tokens") and record["median_ms"]:
        # One shape: throughput from the median step, like the other columns (a mean would carry outliers).
        record["tokens_per_s"] = record["real_tokens"] / record["steps_run"] * 1e3 / record["median_ms"]
    per_epoch = record["recompiles_per_epoch"]
    record["recompiles_after_first_epoch"] = sum(per_epoch[1:]) if len(per_epoch) > 1 else None
    if record["median_ms"]:
        record["samples_per_s"] = workload.batch_size * 1e3 / record["median_ms"]
    record["mfu"] = mfu(record.get("tokens_per_s"), workload.flops_per_token, settings.peak_flops)
    record["peak_memory_gb"] = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    if before_ab.get("peak_memory_gb") is not None:
        record["peak_memory_gb_with_ab"] = record["peak_memory_gb"]
        record["peak_memory_gb"] = before_ab["peak_memory_gb"]
    return record


def _set_eager_stance(eager: bool) -> None:
    """The in-fit A/B's switch: every torch.compile'd frame runs its original code while eager."""
    torch.compiler.set_stance("force_eager" if eager else "default")


AB_STOPS_ROUNDS = "re-pricing stopped by the harness for its in-fit A/B (its eager blocks would run inside a round)"


def _before_ab(callback: Any, device: torch.device) -> dict[str, Any]:
    """What the record takes from before the in-fit A/B: the callback's report summary as it stands (its
    figures, the keys of the final report's) and the peak memory of the fit so far. The callback's
    re-pricing rounds stop here: a round inside the A/B would time the A/B's forced-eager blocks as its
    compiled ones (a 5000-step ResNet-18 CIFAR run's final report read 1.345x from one, 2026-12-04)."""
    peak = torch.cuda.max_memory_allocated(device) / 2**30 if device.type == "cuda" else None
    summary = callback.run.build_report()["summary"]
    if callback.run.repricer.skipped is None:  # else the report keeps why they stopped earlier
        callback.run.repricer.stop(AB_STOPS_ROUNDS)
    return {"reported": summary, "peak_memory_gb": peak}


def plan_frozen(callback: Any) -> bool | None:
    """Whether the CompileCallback's plan is frozen (its trials over), None where it has no planner yet."""
    run = getattr(callback, "run", None)  # the fit's CompileRun
    frozen = getattr(getattr(run, "planner", None), "frozen", None)
    return None if frozen is None else bool(frozen)


class LoaderData(LightningDataModule):
    """A DataModule around one ready-made training loader."""

    def __init__(self, loader: Any) -> None:
        super().__init__()
        self.loader = loader

    def train_dataloader(self) -> Any:
        return self.loader


def _lightning_fit(
    module: LightningModule,
    loader: Any,
    meter: StepMeter,
    settings: RunSettings,
    variant: Variant,
    callback: Any,
    *,
    workload_name: str,
    pauses: ChildPauseAB | None = None,
) -> None:
    cuda = settings.device.type == "cuda"
    # The meter's start goes first and its end last, so the CompileCallback's hooks are inside the
    # timed step: its monitoring overhead is part of what is measured.
    callbacks = [StepStart(meter), *([callback] if callback is not None else []), StepEnd(meter),
                 *([ChildPauses(pauses)] if pauses is not None else [])]
    profile = _step_profile(settings, variant, workload_name)
    if profile is not None:
        callbacks.insert(0, StepTrace(profile))
    trainer = Trainer(
        accelerator="auto",
        devices=1,
        precision=precision(settings),
        max_steps=settings.planned_steps,
        limit_val_batches=0,
        num_sanity_val_steps=0,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        # cuDNN picks the fastest convolution algorithm per shape: a strong eager baseline.
        benchmark=True if cuda else None,
        default_root_dir=os.path.join(settings.run_dir, variant.name),
        callbacks=callbacks,
    )
    meter.begin()
    # Through a DataModule, as the recipes give their data: a callback can then reach the loader before
    # its first iterator is made (CompileCallback(pad=...) pads from the first batch).
    trainer.fit(module, datamodule=LoaderData(loader))
    if meter.steps < settings.total_steps:
        raise RuntimeError(
            f"the Trainer stopped after {meter.steps} of {settings.total_steps} steps; the dataloader or "
            f"max_steps={settings.planned_steps} is too short."
        )


def _step_profile(settings: RunSettings, variant: Variant, workload_name: str) -> StepProfile | None:
    """The ``--trace-steps`` profile of a variant: its cycles just before the measured window."""
    if not settings.trace_steps:
        return None
    first = settings.total_steps - settings.measured_steps - settings.trace_steps
    path = os.path.join(settings.trace_dir, f"{workload_name}-{variant.name}-trace.md")
    return StepProfile(first, settings.trace_steps, path, title=f"{variant.name}: {variant.description}")


def _plain_loop(module: torch.nn.Module, loader: Any, meter: StepMeter, workload: Workload, device: torch.device,
                *, trace: StepProfile | None = None, optimizer_compile: dict[str, Any] | None = None) -> None:
    """The same training step with no Lightning: autocast, forward + loss, backward, optimizer step.
    ``trace`` profiles cycles from one batch's start to the next's, the batch's copy to the device
    included, as :class:`~benchmarks.trace.StepTrace` does in a Lightning fit. ``optimizer_compile``:
    ``torch.compile``'s keyword arguments for the optimizer step, None: it stays eager."""
    module.to(device)
    module.train()
    optimizer = plain_optimizer(workload.optimizer(module), optimizer_compile)
    # Two CUDA-graph trees' functions a step (the model's, the optimizer's): each step starts a new
    # generation, or the next forward finds its outputs overwritten (session 29, call 4: the variant
    # failed so on the H200 without this; not yet run with it).
    mark_step = captures_cuda_graphs_with(optimizer_compile)
    meter.begin()
    done = False
    try:
        while not done:
            for batch in loader:
                if trace is not None:
                    trace.batch_start(device)
                batch = {key: value.to(device, non_blocking=True) for key, value in batch.items()}
                meter.step_start()
                if mark_step:
                    torch.compiler.cudagraph_mark_step_begin()
                loss = plain_step(workload, module, optimizer, batch)
                done = meter.step_end(batch=batch, loss=loss)
                if done:
                    break
    finally:
        if trace is not None:
            trace.close()


def captures_cuda_graphs_with(compile_kwargs: dict[str, Any] | None) -> bool:
    """Whether ``torch.compile(**compile_kwargs)`` captures CUDA graphs (the product's rule, one place)."""
    if compile_kwargs is None:
        return False
    return captures_cuda_graphs(compile_kwargs.get("backend", "inductor"), compile_kwargs.get("mode"),
                                compile_kwargs.get("options"))


def plain_optimizer(optimizer: torch.optim.Optimizer, compile_kwargs: dict[str, Any] | None) -> torch.optim.Optimizer:
    """The plain loop's optimizer: the workload's, or (``compile_kwargs``) its foreach twin with ``step``
    compiled by ``torch.compile(**compile_kwargs)``; the loop still calls ``optimizer.step()``."""
    if compile_kwargs is None:
        return optimizer
    optimizer = foreach_twin(optimizer)
    optimizer.step = torch.compile(optimizer.step, **compile_kwargs)
    return optimizer


def foreach_twin(optimizer: torch.optim.Optimizer) -> torch.optim.Optimizer:
    """The same optimizer class over the same parameter groups (every key of each group kept), with the
    ``foreach`` implementation in place of a ``fused`` one, built before any step: fresh state, the class's
    own ``defaults``, no hooks or scheduler of the original's. Dynamo does not trace a fused optimizer's
    kernel (it is behind ``torch.compiler.disable``: a compiled ``step`` would run it eagerly), while
    Inductor compiles the foreach update into its own kernels (PyTorch's "compiling the optimizer" recipe)."""
    groups = [{**group, "fused": False, "foreach": True} for group in optimizer.param_groups]
    return type(optimizer)(groups)


def autocast_for(device: torch.device) -> contextlib.AbstractContextManager:
    """The benchmarks' precision: bf16 autocast on CUDA, none on CPU (smoke runs)."""
    return torch.autocast("cuda", dtype=torch.bfloat16) if device.type == "cuda" else contextlib.nullcontext()


def plain_step(workload: Workload, module: torch.nn.Module, optimizer: torch.optim.Optimizer,
               batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """One training step of the plain loop, ``batch`` already on the device: forward + loss under
    autocast, backward, optimizer step; returns the loss."""
    device = next(iter(batch.values())).device
    with autocast_for(device):
        loss = workload.loss(module, batch)
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return loss


def add_speedups(records: list[dict[str, Any]], *, by_throughput: bool) -> None:
    """``speedup_vs_eager``: eager median step time / the variant's (variable lengths: real tokens/s ratio)."""
    eager = next((r for r in records if r["variant"] == "eager" and r.get("status") == "ok"), None)
    for record in records:
        if record.get("status") != "ok":
            continue
        if eager is None:
            record["speedup_vs_eager"] = None
        elif by_throughput:
            record["speedup_vs_eager"] = speedup(record.get("tokens_per_s"), eager.get("tokens_per_s"))
        else:
            record["speedup_vs_eager"] = speedup(eager.get("median_ms"), record.get("median_ms"))
        record["speedup_basis"] = "real tokens/s" if by_throughput else "median step time"


def _one_line(record: dict[str, Any]) -> str:
    if record.get("status") != "ok":
        return f"{record.get('status')}: {record.get('reason') or record.get('error')}"
    return (
        f"median {record['median_ms']:.2f} ms, p90 {record['p90_ms']:.2f} ms, "
        f"wall {record['wall_first_steps_s']:.1f} s, compile {record['compile_s']:.1f} s, "
        f"graphs {record['graphs']}, recompiles {record['recompiles']}, breaks {record['graph_breaks']}"
        + (f", peak {record['peak_memory_gb']:.2f} GB" if record.get("peak_memory_gb") is not None else "")
        + (f", plan frozen at step {record['plan_frozen_at_step']} of {record['steps_run']}"
           if "plan_frozen_at_step" in record else "")
    )
