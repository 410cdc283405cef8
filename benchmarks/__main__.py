"""``python -m benchmarks --workload gpt2``: every variant of a workload, side by side, in one process.

One command per workload on the H200 (each fits a 10-minute limit, compiling cold included):

    python -m benchmarks --workload gpt2             # ~4-5 min (~3-4 before whole_ro was added; estimate)
    python -m benchmarks --workload resnet50         # ~5-7 min (~4-6 before whole_ro was added; estimate)
    python -m benchmarks --workload resnet18_cifar   # ~3-5 min
    python -m benchmarks --workload gpt2_varlen      # ~8 min (3 epochs of 204 steps, 5 of its 7 variants)
    python -m benchmarks --workload hf_gpt2          # ~4 min (Hugging Face GPT2LMHeadModel 124M, B8 x 1024)
    python -m benchmarks --workload timm_vit         # ~3 min (timm vit_base_patch16_224, B64)
    python -m benchmarks --workload hf_bert_mlm      # HF BertForMaskedLM 110M, B32 x 512 (named runs only)
    python -m benchmarks --workload hf_gpt2_direct   # hf_gpt2 with training_step calling self.model, no forward (named runs only)

    python -m benchmarks --workload hf_gpt2 --memory-cap-gb 14.6   # a smaller card: allocations past 14.6 GiB raise

    python -m benchmarks --workload gpt2 --total-steps 1000   # adds the first-1000-steps wall time
    python -m benchmarks --workload resnet18_cifar --variants whole_ro callback
    python -m benchmarks --smoke                              # every workload, tiny, on CPU (~2 min)

The zoo (named runs only; workloads.py lists its models), eager / whole / whole_ro / callback / eager_end each,
~3-5 min a workload on one H100 (an estimate from resnet50's, timm_vit's, hf_gpt2's and hf_bert_mlm's runs:
three compiles of 30-90 s each dominate), so two workloads fit a 10-minute command:

    python -m benchmarks --workload zoo_vit_b        # timm vit_base_patch16_224, drop path 0.1, B64
    python -m benchmarks --workload zoo_convnext_t   # timm convnext_tiny, drop path 0.1, B64, channels_last
    python -m benchmarks --workload zoo_regnety_016  # timm regnety_016, B128, channels_last
    python -m benchmarks --workload zoo_resnet50     # resnet50's model and batches
    python -m benchmarks --workload zoo_llama        # HF LlamaForCausalLM 134M (12 x 768), B8 x 1024
    python -m benchmarks --workload zoo_lora         # zoo_llama under PEFT LoRA r=16 (q_proj, v_proj), base frozen
    python -m benchmarks --workload zoo_bart         # HF BartForConditionalGeneration at bart-base's sizes, B16, 256 + 256 tokens
    python -m benchmarks --workload zoo_bert         # hf_bert_mlm's model and batches
    python -m benchmarks --workload zoo --smoke      # every zoo workload, tiny, on CPU (~1 min a workload on 2 cores)

``--workload zoo`` runs every zoo workload in one process, one result file each; at real sizes that is
longer than one command may run. zoo_lora needs peft and what it imports (accelerate,
psutil), which the GPU machine lacks: their wheels go with the omegaconf one.

Writes ``<out>/<workload>-<date>.json`` (one record per variant; rewritten after each variant, so a
run cut short keeps what it measured) and ``.md`` (the table), and prints the table.
``python -m benchmarks.table benchmarks/results/*.json`` renders BENCHMARKS.md from them.
"""

from __future__ import annotations

import argparse
import datetime
import json
import logging
import math
import os
import platform
import shlex
import sys
import warnings
from typing import Any

import lightning
import torch

from benchmarks import dynamo_counts
from benchmarks.measure import H200_PEAK_BF16_FLOPS
from benchmarks.runner import RunSettings, precision, precision_for, run_workload
from benchmarks.table import render_result
from benchmarks.variants import VARIANTS, callback_options, make_callback, trial_budget
from benchmarks.workloads import VARIANTS as WORKLOAD_VARIANTS
from benchmarks.workloads import (
    ALL_WORKLOADS,
    DEFAULT_VARIANTS,
    SMOKE_VARIANTS,
    VARLEN_LENGTHS,
    WORKLOADS,
    ZOO_WORKLOADS,
    Workload,
    make_workload,
)

DEFAULT_OUT = os.path.join("benchmarks", "results")
SMOKE_OUT = os.path.join(DEFAULT_OUT, "smoke")  # not kept in git: smoke numbers are no measurement
ALL = "all"
ZOO = "zoo"
WORKLOAD_GROUPS = {ALL: ALL_WORKLOADS, ZOO: ZOO_WORKLOADS}  # --workload names that run several, in this order
COMPILE_CACHES = {  # --compile-caches, as the results' settings say it
    "off": "disabled: every variant compiles cold",
    "fresh": "on, an empty cache folder for each variant: cold, and the callback's background compile on where it pays",
}


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m benchmarks",
        description="Run the variants of a workload one after another in one process, on the same data and "
        "initial weights, and report step times, speedups against Lightning eager, compile cost and "
        "dynamo's counts.",
    )
    parser.add_argument(
        "--workload", choices=(*WORKLOADS, *WORKLOAD_GROUPS), default=ALL,
        help="which workload (default: all of them but the product checks (hf_bert_mlm, hf_gpt2_direct) and the zoo, "
        "one after another; on a GPU run one per command); 'zoo': every zoo_* workload, one after another.",
    )
    parser.add_argument(
        "--variants", nargs="+", metavar="VARIANT",
        help=f"a subset of the workload's variants ({', '.join(VARIANTS)}); 'eager' (the speedups are "
        "measured against it) and 'eager_end' (eager again, last: the host's drift over the run) are always added.",
    )
    parser.add_argument(
        "--as-listed", action="store_true",
        help="run --variants in the order listed (still 'eager' first and 'eager_end' last) instead of the "
        "workload's order: run a comparison in both orders and trust a ratio only when it survives both.",
    )
    parser.add_argument(
        "--steps", type=int, default=None,
        help="steady-state steps measured per variant, the last ones of its run (default 60, smoke 3); "
        "gpt2_varlen: the shortest epoch.",
    )
    parser.add_argument(
        "--total-steps", type=int, default=None,
        help="steps every variant runs (default: what CompileCallback() may spend on trials + --steps); "
        "1000 also reports the SPEC's first-1000-steps wall time. A callback variant whose plan froze too late "
        "for a steady window of --steps frozen-plan steps runs on, up to that budget + --steps more.",
    )
    parser.add_argument(
        "--epochs", type=int, default=None,
        help="gpt2_varlen: epochs per variant (default 3, smoke 2); the last one is the steady window.",
    )
    parser.add_argument(
        "--planned-steps", type=int, default=None,
        help="max_steps given to the Trainer, i.e. the run length CompileCallback plans for "
        "(default max(5000, total steps)); every variant still stops after --total-steps.",
    )
    parser.add_argument("--out", default=None, help=f"output folder (default {DEFAULT_OUT}; --smoke: {SMOKE_OUT})")
    parser.add_argument(
        "--smoke", action="store_true",
        help="tiny models and dynamo's 'eager' backend: checks the harness on CPU in seconds.",
    )
    parser.add_argument(
        "--no-cudnn-attention", action="store_true",
        help="keep scaled_dot_product_attention off cuDNN (flash attention instead) in every workload; "
        "gpt2_varlen always runs without it.",
    )
    parser.add_argument(
        "--trace-steps", type=int, default=0,
        help="profile this many step cycles of each variant, the plain loop's too (CPU + CUDA), just before the measured "
        "window and write <workload>-<variant>-trace.md: wall against GPU busy time, waits, top kernels.",
    )
    parser.add_argument(
        "--memory-cap-gb", type=float, default=None, metavar="GB",
        help="cap this process's CUDA memory at GB GiB (torch.cuda.set_per_process_memory_fraction), as on a "
        "smaller or fuller card: an allocation past it raises OutOfMemoryError. CUDA only.",
    )
    parser.add_argument(
        "--in-fit-ab", type=int, default=None, metavar="BLOCKS",
        help="after its steady window a callback variant (fixed shapes) runs BLOCKS blocks of "
        "--in-fit-ab-steps steps, eager (torch.compiler.set_stance('force_eager')) and compiled in turn, ABBA: "
        "an A/B inside one fit that the host's drift over the run does not bias, beside the A/B against the "
        "eager variant (default 32, eight cycles, whose median the table bounds without the outer ones; 128 for "
        "resnet18_cifar; smoke 4; "
        "none under --memory-cap-gb: its eager steps run beside the plan's "
        "memory; 0: none; a multiple of 4).",
    )
    parser.add_argument(
        "--in-fit-ab-steps", type=int, default=None, metavar="STEPS",
        help="steps per in-fit A/B block, the first 2 not counted (default 10, smoke 3).",
    )
    parser.add_argument(
        "--compile-caches", choices=("off", "fresh"), default="off",
        help="off (default): Inductor's compile caches are off, every variant compiles from scratch in-process "
        "(the CompileCallback's background compile, which hands its work over through the cache, is then off "
        "too); fresh: caches on, each variant starting from an empty cache folder of its own under "
        "<out>/caches, as on a machine that never compiled the model: the callback's default on CUDA.",
    )
    parser.add_argument(
        "--precision", choices=("bf16-mixed", "bf16-true", "32-true"), default=None,
        help="the Lightning variants' Trainer precision (default bf16-mixed on CUDA, 32-true on CPU); "
        "bf16-true: parameters in bf16, no autocast. The plain-loop (bare_*) variants run bf16 autocast only: "
        "they cannot be chosen with another precision.",
    )
    parser.add_argument(
        "--pairs", type=int, default=None, metavar="N",
        help="eager and the one other variant of --variants in turn, N times, in one process, eager first and last "
        "(E X E X ... E; no eager_end): each X's first --total-steps wall time against the mean of the eager runs "
        "either side of it, a comparison the host's drift over minutes does not bias (BENCHMARKS.md's first-1000 "
        "target on a host whose eager moves 10-30%% between runs).",
    )
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if args.pairs is not None and args.pairs < 1:
        parser.error(f"--pairs must be at least 1; got {args.pairs}.")
    if args.in_fit_ab is not None and (args.in_fit_ab < 0 or args.in_fit_ab % 4):
        parser.error(f"--in-fit-ab must be 0 or a multiple of 4 (whole ABBA cycles); got {args.in_fit_ab}.")
    if args.in_fit_ab_steps is not None and args.in_fit_ab_steps < 3:
        parser.error(f"--in-fit-ab-steps must be at least 3 (the first 2 of a block are not counted); got {args.in_fit_ab_steps}.")
    if args.memory_cap_gb is not None and not (args.memory_cap_gb > 0 and math.isfinite(args.memory_cap_gb)):
        parser.error(f"--memory-cap-gb must be a positive number of GiB; got {args.memory_cap_gb}.")
    if args.trace_steps < 0:
        parser.error(f"--trace-steps must be 0 or more; got {args.trace_steps}.")
    for name in ("steps", "total_steps", "epochs", "planned_steps"):
        value = getattr(args, name)
        if value is not None and value < 1:
            parser.error(f"--{name.replace('_', '-')} must be at least 1; got {value}.")
    return args


def select_variants(
    workload_variants: tuple[str, ...], requested: list[str] | None, workload: str,
    defaults: tuple[str, ...] | None = None, *, as_listed: bool = False,
) -> list[str]:
    """The requested variants in the workload's order (``as_listed``: in the order requested), with ``eager`` first and
    ``eager_end`` last; ``defaults`` (else all of them) when none are requested.

    Raises:
        ValueError: a variant this workload does not have, with the ones it has.
    """
    if not requested:
        return list(defaults or workload_variants)
    names = [name for item in requested for name in item.split(",") if name]
    unknown = [name for name in names if name not in workload_variants]
    if unknown:
        raise ValueError(
            f"--variants: {', '.join(unknown)} not a variant of {workload}; choose from {', '.join(workload_variants)}."
        )
    if as_listed:
        middle = [name for name in dict.fromkeys(names) if name not in ("eager", "eager_end")]
        return ["eager", *middle, *(["eager_end"] if "eager_end" in workload_variants else [])]
    wanted = set(names) | {"eager", "eager_end"}
    return [name for name in workload_variants if name in wanted]


def paired_variants(selected: list[str], pairs: int) -> list[str]:
    """``--pairs``: eager and the one other selected variant in turn, ``pairs`` times, eager first and last.

    Raises:
        ValueError: not exactly one variant besides eager and eager_end.
    """
    others = [name for name in selected if name not in ("eager", "eager_end")]
    if len(others) != 1:
        raise ValueError(f"--pairs alternates eager with one variant; --variants gave {', '.join(others) or 'none'}: "
                         "name exactly one (e.g. --variants callback).")
    return ["eager", *[name for _ in range(pairs) for name in (others[0], "eager")]]


# In-fit A/B blocks by default where 32 are too few. ResNet-18 CIFAR's 3-8 ms host-bound steps on the H200
# (2026-12-04): 8 cycles read 2.615-3.096x and 2.347-3.319x, the interval of their median 11% wide, where
# 32 cycles (128 blocks, ~1,300 steps, under 15 s) put it at 2.584-2.737x and 2.575-2.746x.
IN_FIT_AB_BLOCKS = {"resnet18_cifar": 128}


def resolve_settings(args: argparse.Namespace, workload_name: str, device: torch.device, out: str) -> RunSettings:
    """Step counts: long enough for the callback's trials, then a steady window for every variant."""
    measured = args.steps or (3 if args.smoke else 60)
    budget = trial_budget(make_callback(VARIANTS["callback"], smoke=args.smoke))
    if workload_name == "gpt2_varlen":
        if args.total_steps is not None:
            raise ValueError("--total-steps is for the fixed-shape workloads; gpt2_varlen runs --epochs epochs.")
        # An epoch holds the callback's whole trial phase: "zero recompiles after the first epoch"
        # then means zero recompiles once the plan is frozen. Epochs are whole cycles of lengths, with one
        # cycle more than the budget: a trial here runs on for each new length's first step, which the
        # budget does not count (the smoke run's plan froze at batch 26 of a budget of 20).
        epoch_steps = VARLEN_LENGTHS * math.ceil(max(budget + VARLEN_LENGTHS, measured) / VARLEN_LENGTHS)
        epochs = args.epochs or (2 if args.smoke else 3)
        total, measured = epochs * epoch_steps, epoch_steps
        if args.trace_steps > total - measured:
            raise ValueError(
                f"--trace-steps ({args.trace_steps}) must fit before the last epoch ({total - measured} steps); "
                f"ask for fewer, or more --epochs."
            )
    else:
        epoch_steps = None
        total = args.total_steps or budget + args.trace_steps + measured  # traced steps after the trials
        if total < measured + args.trace_steps:
            raise ValueError(
                f"--total-steps ({total}) must be at least --steps ({measured}) + --trace-steps ({args.trace_steps})."
            )
    # A callback variant whose plan froze later than the budget says (more trials, longer eager
    # windows) runs on until its steady window holds only frozen-plan steps, up to this many.
    longest = total + budget + measured if epoch_steps is None else total
    # Not under a memory cap unless asked for: the A/B's eager steps run beside the kept plan's memory
    # (a CUDA-graph pool), which a run sized to the card need not hold (HF GPT-2 under 15.3 GiB: OOM).
    # Eight ABBA cycles: from eight on, the interval of their median leaves out the outer ones
    # (benchmarks.checks.in_fit_spread); a host-bound step's eager regimes put single cycles 5% apart.
    default_blocks = 0 if args.memory_cap_gb is not None else 4 if args.smoke else IN_FIT_AB_BLOCKS.get(workload_name, 32)
    ab_blocks = args.in_fit_ab if args.in_fit_ab is not None else default_blocks
    ab_steps = args.in_fit_ab_steps or (3 if args.smoke else 10)
    planned = max(args.planned_steps or 5000, longest + ab_blocks * ab_steps)
    return RunSettings(
        device=device,
        smoke=args.smoke,
        total_steps=total,
        measured_steps=measured,
        planned_steps=planned,
        epoch_steps=epoch_steps,
        run_dir=os.path.join(out, "runs", workload_name),
        peak_flops=H200_PEAK_BF16_FLOPS if device.type == "cuda" else None,
        seed=args.seed,
        trace_steps=args.trace_steps,
        trace_dir=out,
        longest_steps=longest,
        in_fit_ab_blocks=ab_blocks if epoch_steps is None else 0,
        in_fit_ab_block_steps=ab_steps,
        fresh_caches_dir=os.path.join(out, "caches") if args.compile_caches == "fresh" else None,
        precision=args.precision,
    )


def environment(device: torch.device) -> dict[str, Any]:
    return {
        "torch": torch.__version__,
        "lightning": lightning.__version__,
        "python": platform.python_version(),
        "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else None,
        "device": torch.cuda.get_device_name(device) if device.type == "cuda" else f"CPU ({platform.machine()}, {os.cpu_count()} cores)",
        "date": datetime.datetime.now().astimezone().isoformat(timespec="seconds"),
    }


def output_stem(out: str, workload: str, *, smoke: bool) -> str:
    date = datetime.date.today().isoformat()
    return os.path.join(out, f"{workload}{'-smoke' if smoke else ''}-{date}")


def apply_memory_cap(cap_gb: float, device: torch.device) -> dict[str, Any]:
    """Caps the CUDA caching allocator at ``cap_gb`` GiB of the device, for the whole process.

    Returns:
        What the result records: the cap, the fraction given to torch, the device's memory.

    Raises:
        ValueError: not on a CUDA device, or a cap above the device's memory.
    """
    if device.type != "cuda":
        raise ValueError(
            f"--memory-cap-gb {cap_gb:g} needs a CUDA device (it caps torch.cuda's allocator with "
            "set_per_process_memory_fraction); this machine has none: drop the option, or run on a GPU."
        )
    index = device.index if device.index is not None else torch.cuda.current_device()
    total = torch.cuda.get_device_properties(index).total_memory
    fraction = cap_gb * 2**30 / total
    if fraction > 1:
        raise ValueError(
            f"--memory-cap-gb {cap_gb:g} is more than the device's {total / 2**30:.1f} GiB; ask for less."
        )
    # Allocations past the cap raise torch.OutOfMemoryError as on a card that small (issue 19).
    torch.cuda.set_per_process_memory_fraction(fraction, index)
    return {"memory_cap_gb": cap_gb, "memory_fraction": fraction, "device_memory_gb": total / 2**30}


def new_result(
    args: argparse.Namespace, command: str, workload: Workload, variant_names: list[str], settings: RunSettings,
    memory_cap: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """The result file's header: what ran, where, how; the records follow."""
    return {
        "workload": workload.name,
        "description": workload.description,
        "command": command,
        **environment(settings.device),
        "smoke": args.smoke,
        "complete": False,
        "settings": {
            "precision": precision(settings),
            "total_steps": settings.total_steps,
            "longest_callback_steps": settings.longest_steps,
            "measured_steps": settings.measured_steps,
            "planned_steps": settings.planned_steps,
            "epoch_steps": settings.epoch_steps,
            "in_fit_ab": {"blocks": settings.in_fit_ab_blocks, "block_steps": settings.in_fit_ab_block_steps},
            "batch_size": workload.batch_size,
            "flops_per_token": workload.flops_per_token,
            "peak_flops": settings.peak_flops,
            "callback_options": callback_options(VARIANTS["callback"], smoke=args.smoke),
            "compile_caches": COMPILE_CACHES[args.compile_caches],
            "cudnn_attention": workload.cudnn_attention,
            "seed": args.seed,
            "pairs": args.pairs,
            "memory_cap_gb": None,
            **(memory_cap or {}),
        },
        "variants": variant_names,
        "records": [],
    }


def write_result(result: dict[str, Any], stem: str) -> None:
    """``<stem>.json`` (the records) and ``<stem>.md`` (the table), rewritten after every variant."""
    with open(stem + ".json", "w") as handle:
        json.dump(result, handle, indent=2, default=str)
    with open(stem + ".md", "w") as handle:
        handle.write(render_result(result))


def run(args: argparse.Namespace, command: str) -> int:
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    out = args.out or (SMOKE_OUT if args.smoke else DEFAULT_OUT)
    os.makedirs(out, exist_ok=True)
    workloads = list(WORKLOAD_GROUPS.get(args.workload, (args.workload,)))
    plans = []
    try:  # every selection checked before anything runs
        for workload_name in workloads:
            settings = resolve_settings(args, workload_name, device, out)
            variant_names = select_variants(  # --smoke: every variant somewhere (it is the harness's test)
                WORKLOAD_VARIANTS[workload_name], args.variants, workload_name,
                (SMOKE_VARIANTS if args.smoke else DEFAULT_VARIANTS)[workload_name], as_listed=args.as_listed,
            )
            if args.pairs is not None:
                variant_names = paired_variants(variant_names, args.pairs)
            plain = [name for name in variant_names if not VARIANTS[name].lightning]
            if plain and precision(settings) != precision_for(device):
                raise ValueError(f"--precision {args.precision}: the plain-loop variants ({', '.join(plain)}) run "
                                 f"{precision_for(device)} only; leave them out or leave --precision out.")
            plans.append((workload_name, variant_names, settings))
        memory_cap = apply_memory_cap(args.memory_cap_gb, device) if args.memory_cap_gb is not None else None
    except ValueError as error:
        print(f"error: {error}", file=sys.stderr)
        return 2
    failed = False
    for workload_name, variant_names, settings in plans:
        workload = make_workload(workload_name, smoke=args.smoke, device=device, seed=args.seed)
        if args.no_cudnn_attention:
            workload.cudnn_attention = False
        result = new_result(args, command, workload, variant_names, settings, memory_cap)
        stem = output_stem(out, workload_name, smoke=args.smoke)

        def save(records: list[dict[str, Any]]) -> None:
            result["records"] = records
            write_result(result, stem)

        records = run_workload(workload, variant_names, settings, on_record=save)
        result["complete"] = True
        write_result(result, stem)
        print(render_result(result))
        print(f"written to {stem}.json and {stem}.md\n", flush=True)
        failed = failed or any(r.get("status") == "error" for r in records)
    return 1 if failed else 0


def quiet_logs() -> None:
    """Keeps the log to the benchmark's own lines: Lightning's per-fit banners and known warnings go.

    The CompileCallback's report table goes too; its decisions and numbers are in the JSON and the
    notes under the table.
    """
    logging.getLogger("lightning.pytorch").setLevel(logging.WARNING)
    for message in (
        ".*does not have many workers.*",  # the batches are pre-made on the device
        ".*`validation_step` but have no `val_dataloader`.*",  # no validation, on purpose
        ".*treespec, LeafSpec.*",  # Lightning 2.6 on torch >= 2.10, nothing to act on
        ".*dynamo_pgo force disabled.*",  # the point of disable_compile_caches()
    ):
        warnings.filterwarnings("ignore", message=message)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    command = "python -m benchmarks " + shlex.join(sys.argv[1:] if argv is None else argv)
    # TF32 for float32 matmuls (outside autocast: optimizer math, the CPU smoke run's fp32): a strong
    # baseline, as BENCHMARKING.md asks; it applies to every variant alike.
    torch.set_float32_matmul_precision("high")
    # cuDNN searches the fastest convolution algorithm per shape (the Trainers get benchmark=True too;
    # set here so the plain loop, which runs first, gets the same strong convolutions).
    torch.backends.cudnn.benchmark = torch.cuda.is_available()
    dynamo_counts.keep_all_compile_records()
    if args.compile_caches == "off":
        dynamo_counts.disable_compile_caches()
    quiet_logs()
    return run(args, command)


if __name__ == "__main__":
    sys.exit(main())
