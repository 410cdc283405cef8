"""Mutation check: break the package on purpose, one way at a time, and see whether the tests notice.

    make mutate                                  # every mutation below
    .venv/bin/python tests/mutations.py resume   # only those whose name contains "resume"

Each mutation is a textual edit to one file of a temporary copy of the working tree (the files git
tracks or would track; no .venv, no .git), together with the tests that exist to catch it. The
script first runs every listed test on the unmodified copy (a test that fails there proves nothing),
then, for each mutation, applies it to a fresh copy and runs its tests there with the same Python and
``PYTHONPATH`` pointing at the copy. An edit whose old text is not found exactly once fails loudly:
the package moved on and the mutation must be rewritten, it must not pass by changing nothing.

Prints a table (mutation, caught / NOT caught, seconds) and exits non-zero if any mutation was not
caught, the baseline failed, or a pattern was not found. Not collected by pytest (no ``test_`` name)
and not part of ``make test``: it runs the listed tests once per mutation (several minutes on 2 cores).
"""

from __future__ import annotations

import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


@dataclasses.dataclass(frozen=True)
class Mutation:
    name: str
    path: str  # relative to the repository root
    old: str  # must occur exactly once in the file
    new: str
    tests: tuple[str, ...]  # pytest node ids or test files, run in the copy


MUTATIONS = [
    Mutation(
        name="CUDA graphs for the largest region tried even where it was kept",
        path="compile_callback/planner.py",
        old="        if largest is None or any(r.name == largest.name for r in self._kept):\n",
        new="        if largest is None:\n",
        tests=("tests/test_mode_trial.py::test_no_graphs_of_the_largest_region_where_it_was_kept_or_graphs_were_tried_or_the_step_keeps_ahead",),
    ),
    Mutation(
        name="CUDA graphs for the smallest region tried, not the largest",
        path="compile_callback/planner.py",
        old="        name = self.agree(max(pool, key=lambda c: c.share).name if pool else None)\n",
        new="        name = self.agree(min(pool, key=lambda c: c.share).name if pool else None)\n",
        tests=("tests/test_mode_trial.py::test_the_largest_region_tried_and_not_kept_gets_cuda_graphs_on_top_of_what_was_kept",),
    ),
    Mutation(
        name="CUDA graphs for the largest region tried though it recompiled",
        path="compile_callback/planner.py",
        old="        if self._recompiled([largest.name]):\n",
        new="        if False:\n",
        tests=("tests/test_mode_trial.py::test_where_the_largest_regions_graphs_are_not_tried_a_note_says_why",),
    ),
    Mutation(
        name="a region whose default trial was never measured counts as tried",
        path="compile_callback/planner.py",
        old="        tried = {d.region for d in self.decisions if d.mode == \"default\" and d.step_ms is not None}\n",
        new="        tried = {d.region for d in self.decisions if d.mode == \"default\"}\n",
        tests=("tests/test_mode_trial.py::test_no_graphs_of_the_largest_region_where_it_was_kept_or_graphs_were_tried_or_the_step_keeps_ahead",),
    ),
    Mutation(
        name="unused-standby-left-running",
        path="compile_callback/run.py",
        old="            self._close_launcher()  # the search is over: a standby never told to go ends\n",
        new="            pass\n",
        tests=("tests/test_background.py::test_a_standby_never_told_to_go_ends_when_the_search_does",),
    ),
    Mutation(
        name="the payload's tensors lose their strides (channels_last arrives contiguous)",
        path="compile_callback/background.py",
        old=".view(getattr(torch, dtype)).as_strided(shape, stride)",
        new=".view(getattr(torch, dtype)).reshape(shape)",
        tests=("tests/test_background.py::test_the_payload_writes_plain_tensors_as_bytes_and_keeps_layout_ties_and_views",),
    ),
    Mutation(
        name="the payload's tensors lose their attributes",
        path="compile_callback/background.py",
        old="    vars(rebuilt).update(state)\n",
        new="",
        tests=("tests/test_background.py::test_the_payload_writes_plain_tensors_as_bytes_and_keeps_layout_ties_and_views",),
    ),
    Mutation(
        name="the payload pickles every tensor torch's way",
        path="compile_callback/background.py",
        old="        if type(obj) not in (torch.Tensor, nn.Parameter) or not _whole_storage(obj):\n",
        new="        if True:\n",
        tests=("tests/test_background.py::test_the_payload_writes_plain_tensors_as_bytes_and_keeps_layout_ties_and_views",),
    ),
    Mutation(
        name="the payload writes a view as its whole storage's bytes",
        path="compile_callback/background.py",
        old="            and tensor.storage_offset() == 0\n            and tensor.untyped_storage().nbytes() == tensor.numel() * tensor.element_size())",
        new="            )",
        tests=("tests/test_background.py::test_the_payload_writes_plain_tensors_as_bytes_and_keeps_layout_ties_and_views",),
    ),
    Mutation(
        name="a child without bytecode to read compiles none first",
        path="compile_callback/background.py",
        old="        env[boot.PRECOMPILE_VARIABLE] = boot.write_listing(sources)\n        made.append(boot.listing_of(env[boot.PRECOMPILE_VARIABLE]))\n",
        new="        pass\n",
        tests=("tests/test_background.py::test_a_child_whose_bytecode_folder_lacks_torchs_compiles_the_runs_sources_into_it_first",),
    ),
    Mutation(
        name="the boot script leaves its folder on sys.path where it is reached through a link",
        path="compile_callback/boot.py",
        old="    _HERE = os.path.realpath(os.path.dirname(os.path.abspath(__file__)))\n",
        new="    _HERE = os.path.dirname(os.path.abspath(__file__))\n",
        tests=("tests/test_background.py::test_a_child_whose_bytecode_folder_lacks_torchs_compiles_the_runs_sources_into_it_first",),
    ),
    Mutation(
        name="a child's bytecode compiled by a quarter of the cores",
        path="compile_callback/boot.py",
        old="    return max(1, min(8, cores // 2))\n",
        new="    return max(1, min(8, cores) // 2)\n",
        tests=("tests/test_background.py::test_a_childs_bytecode_is_compiled_by_half_the_cores_it_may_use_at_most_eight",),
    ),
    Mutation(
        name="an ISSUE batch does not wait for the device first",
        path="compile_callback/run.py",
        old="            torch.cuda.synchronize(self._device)\n",
        new="",
        tests=("tests/test_issue_probe.py",),
    ),
    Mutation(
        name="an ISSUE batch's clock starts before its wait for the device",
        path="compile_callback/run.py",
        old="            torch.cuda.synchronize(self._device)\n            self._issue_started = time.perf_counter()\n",
        new="            self._issue_started = time.perf_counter()\n            torch.cuda.synchronize(self._device)\n",
        tests=("tests/test_issue_probe.py",),
    ),
    Mutation(
        name="an ISSUE sample counted across a validation",
        path="compile_callback/run.py",
        old="        self._issue_started = None  # a batch's issue timed across a validation would count the validation\n",
        new="",
        tests=("tests/test_issue_probe.py",),
    ),
    Mutation(
        name="ISSUE samples in the wrong unit",
        path="compile_callback/run.py",
        old="(planning - self._issue_started) * 1e3",
        new="(planning - self._issue_started) * 1e2",
        tests=("tests/test_issue_probe.py",),
    ),
    Mutation(
        name="standby-not-used",
        path="compile_callback/run.py",
        old="                standby=standby, context=env.forward_context",
        new="                standby=None, context=env.forward_context",
        tests=("tests/test_background.py::test_a_candidate_compiles_in_a_child_while_training_goes_on_eagerly",),
    ),
    Mutation(
        name="standby-not-started-at-setup",
        path="compile_callback/callback.py",
        old="        self.run.start_standby(trainer.strategy.root_device, ",
        new="        (lambda *args: None)(trainer.strategy.root_device, ",
        tests=("tests/test_background.py::test_a_candidate_compiles_in_a_child_while_training_goes_on_eagerly",),
    ),
    Mutation(
        name="setup-standby-left-after-a-failed-start",
        path="compile_callback/run.py",
        old="        if self._standby is not None:  # a fit that failed between its setup and its start\n",
        new="        if False:\n",
        tests=("tests/test_background.py::test_a_fit_that_fails_before_it_starts_stops_the_standby_its_setup_started",),
    ),
    Mutation(
        name="profile-holds-every-input",
        path="compile_callback/planner.py",
        old='        self.profiler = RegionProfiler(candidates, self.device, hold={""})\n',
        new="        self.profiler = RegionProfiler(candidates, self.device)\n",
        tests=("tests/test_payback.py::test_the_planner_tries_the_repeated_blocks_first_in_a_short_run",),
    ),
    Mutation(
        name="part-tried-without-holding-its-inputs",
        path="compile_callback/planner.py",
        old="        if held():\n            return True\n        remove = self.profiler.hold_next(wanted)\n",
        new="        return True\n        remove = self.profiler.hold_next(wanted)\n",
        tests=("tests/test_payback.py::test_the_planner_tries_the_repeated_blocks_first_in_a_short_run",),
    ),
    Mutation(
        name="first-steps-wall-time-ignores-drift",
        path="benchmarks/table.py",
        old="    return Verdict(workload, target, measured, invalid or unsteady or _verdict(passed))\n",
        new="    return Verdict(workload, target, measured, invalid or _verdict(passed))\n",
        tests=("tests/benchmarks/test_checks.py::test_the_first_steps_wall_time_is_answered_by_runs_with_the_compile_caches_on",),
    ),
    Mutation(
        name="part-not-priced-for-a-child-until-held",
        path="compile_callback/planner.py",
        old="region.module_names[0] not in self.profiler.seen:\n",
        new="region.module_names[0] not in self.profiler.held_inputs:\n",
        tests=("tests/test_background.py::test_a_candidate_compiles_in_a_child_while_training_goes_on_eagerly",),
    ),
    Mutation(
        name="child-benchmarks-cudnn",
        path="compile_callback/background.py",
        old='        "cudnn": {"allow_tf32": torch.backends.cudnn.allow_tf32,\n',
        new='        "cudnn": {"allow_tf32": torch.backends.cudnn.allow_tf32, "benchmark": torch.backends.cudnn.benchmark,\n',
        tests=("tests/test_background.py::test_a_child_leaves_cudnn_benchmark_off_whatever_the_parent_runs_with",),
    ),
    Mutation(
        name="standby-preload-failure-fatal",
        path="compile_callback/background.py",
        old="        except Exception as error:  # the unpickling will say it plainly if it matters; the wait goes on\n",
        new="        except ImportError as error:\n            raise\n        except Exception as error:\n",
        tests=("tests/test_background.py::test_a_standby_imports_what_it_is_given_and_a_module_it_cannot_import_is_only_noted",),
    ),
    Mutation(
        name="every-rank-starts-a-child",
        path="compile_callback/planner.py",
        old="        leads = self.rank_zero or elsewhere\n",
        new="        leads = True\n",
        tests=("tests/test_ddp.py::test_under_ddp_rank_zeros_child_prepares_the_compile_for_every_rank",),
    ),
    Mutation(
        name="unpicklable-payload-left-behind",
        path="compile_callback/background.py",
        old="        os.remove(payload)\n        raise Unavailable(f\"the module does not pickle",
        new="        raise Unavailable(f\"the module does not pickle",
        tests=("tests/test_background.py::test_a_module_that_does_not_pickle_is_compiled_in_process",),
    ),
    Mutation(
        name="held-input-copies-not-stalled",
        path="compile_callback/run.py",
        old="        if holding > 0:\n            self._add_stall(\"holding_inputs_s\", holding)\n",
        new="",
        tests=("tests/test_stall.py::test_the_profilers_held_input_copies_count_as_stalled",),
    ),
    Mutation(
        name="held-input-copies-counted-again",
        path="compile_callback/profile.py",
        old="        holding, self.holding_s = self.holding_s, 0.0\n",
        new="        holding = self.holding_s\n",
        tests=("tests/test_stall.py::test_the_profilers_held_input_copies_count_as_stalled",),
    ),
    Mutation(
        name="background-child-not-niced",
        path="compile_callback/background.py",
        old="    env[boot.LOWER_BY_VARIABLE] = str(child_niceness())",
        new="    env[boot.LOWER_BY_VARIABLE] = \"0\"",
        tests=("tests/test_background.py::test_a_candidate_compiles_in_a_child_while_training_goes_on_eagerly",),
    ),
    Mutation(
        name="timer-read-events-not-reused",
        path="compile_callback/timing.py",
        old="            self._free_events += (start, end)\n",
        new="",
        tests=("tests/test_timing.py::test_step_timer_reuses_read_events_and_never_one_still_pending",),
    ),
    Mutation(
        name="timer-discarded-start-pooled-twice",
        path="compile_callback/timing.py",
        old="            if self.use_events:\n                self._free_events.append(started)  # recorded, never read: a later record() replaces it\n",
        new="            if self.use_events:\n                self._free_events.append(started)\n                self._free_events.append(started)\n",
        tests=("tests/test_timing.py::test_step_timer_reuses_read_events_and_never_one_still_pending",),
    ),
    Mutation(
        name="background-unbounded-kill-wait",
        path="compile_callback/background.py",
        old="            process.wait(timeout=KILL_WAIT_S)\n",
        new="            process.wait()\n",
        tests=("tests/test_background.py::test_a_child_that_cannot_exit_does_not_hold_the_fit",),
    ),
    Mutation(
        name="verify-dropout-left-off",
        path="compile_callback/verify.py",
        old="            layer.p = p\n",
        new="            pass\n",
        tests=("tests/test_verify.py::test_a_region_that_draws_random_numbers_is_verified_on_a_twin_and_trains_on_its_own_graph",),
    ),
    Mutation(
        name="verify-dropout-twin-per-module",
        path="compile_callback/verify.py",
        old="    scope = (twin_scope or torch_internals.TwinScope()) if twin is not None else None",
        new="    scope = torch_internals.TwinScope() if twin is not None else None",
        tests=("tests/test_verify.py::test_the_modules_of_one_region_share_one_twin_and_leave_nothing_behind",),
    ),
    Mutation(
        name="verify-dropout-twin-code-kept-in-module-globals",
        path="compile_callback/torch_internals.py",
        old='_twin_call.__code__.replace(), {"__builtins__": builtins},',
        new="_twin_call.__code__.replace(), _twin_call.__globals__,",
        tests=("tests/test_verify.py::test_the_modules_of_one_region_share_one_twin_and_leave_nothing_behind",),
    ),
    Mutation(
        name="verify-dropout-on-the-training-graph",  # issue 19: BERT trained on a fallback_random graph (+2.2 GB)
        path="compile_callback/verify.py",
        old="                stack.enter_context(scope.running(module, **twin))",
        new="                pass",
        tests=("tests/test_verify.py::test_a_region_that_draws_random_numbers_is_verified_on_a_twin_and_trains_on_its_own_graph",),
    ),
    Mutation(
        name="verification parks a storage that cannot be resized",
        path="compile_callback/verify.py",
        old="    return bool(storage.nbytes()) and storage.resizable()\n",
        new="    return bool(storage.nbytes())\n",
        tests=("tests/test_verify.py::test_only_storages_that_hold_bytes_and_resize_are_parked",),
    ),
    Mutation(
        name="a re-priced eager median beside the trials' eager p90",
        path="compile_callback/run.py",
        old="        eager_p90 = latest.eager_p90_ms if latest is not None and latest.eager_p90_ms is not None else eager.get(\"p90_ms\")\n",
        new="        eager_p90 = eager.get(\"p90_ms\")\n",
        tests=("tests/test_reprice.py::test_a_frozen_plan_is_repriced_with_eager_beside_it",),
    ),
    Mutation(
        name="the targets table's record counts inconclusive runs as answers",
        path="benchmarks/table.py",
        old="        if not (_unanswered(verdict) or verdict.verdict.startswith(\"inconclusive\")):\n",
        new="        if not _unanswered(verdict):\n",
        tests=("tests/benchmarks/test_checks.py::test_the_targets_table_counts_the_stored_runs_that_met_each_target",),
    ),
    Mutation(
        name="the targets table's record counts the oldest runs as the newest",
        path="benchmarks/table.py",
        old="(f\" (newest {RECENT}: {sum(met[:RECENT])})\"",
        new="(f\" (newest {RECENT}: {sum(met[-RECENT:])})\"",
        tests=("tests/benchmarks/test_checks.py::test_the_targets_table_counts_the_stored_runs_that_met_each_target",),
    ),
    Mutation(
        name="a paired run's median keeps the pairs across which eager moved",
        path="benchmarks/table.py",
        old="    steady = [pair for pair in pairs if abs(pair[\"eager_move\"]) <= DRIFT_WARNING]\n",
        new="    steady = list(pairs)\n",
        tests=("tests/benchmarks/test_checks.py::test_a_paired_run_answers_the_first_steps_wall_time_by_its_pairs_medians",),
    ),
    Mutation(
        name="--pairs ends on the variant, not on eager",
        path="benchmarks/__main__.py",
        old="    return [\"eager\", *[name for _ in range(pairs) for name in (others[0], \"eager\")]]\n",
        new="    return [\"eager\", *[name for _ in range(pairs) for name in (\"eager\", others[0])]]\n",
        tests=("tests/benchmarks/test_smoke.py::test_pairs_alternate_eager_with_one_variant_and_each_pair_is_reported",),
    ),
    Mutation(
        name="a --pairs run's table lists only callback's pairs (an experiment's paired variant silently has none)",
        path="benchmarks/table.py",
        old="    name = paired_variant(result)\n",
        new="    name = \"callback\"\n",
        tests=("tests/benchmarks/test_smoke.py::test_pairs_alternate_eager_with_one_variant_and_each_pair_is_reported",),
    ),
    Mutation(
        name="the child-pause A/B never stops the child (its stopped blocks run it too)",
        path="benchmarks/measure.py",
        old="                    os.kill(pid, signal.SIGSTOP)\n",
        new="                    pass\n",
        tests=("tests/benchmarks/test_child_pause.py::test_the_child_is_stopped_in_the_abba_blocks_of_a_fit_and_runs_on_after_them",),
    ),
    Mutation(
        name="the child-pause A/B keeps the switch's own time in its block's wall",
        path="benchmarks/measure.py",
        old="                walls[block] -= switch.get(\"seconds\", 0.0)\n",
        new="                pass\n",
        tests=("tests/benchmarks/test_child_pause.py::test_the_ab_reads_running_blocks_against_stopped_ones_and_leaves_out_cycles_with_nothing_stopped",),
    ),
    Mutation(
        name="the state key forgets the regions",
        path="compile_callback/callback.py",
        old="        self._state_key = self._generate_state_key(regions=str(self.regions), backend=backend_name(self.backend))\n",
        new="        self._state_key = self._generate_state_key(backend=backend_name(self.backend))\n",
        tests=("tests/test_options.py::test_the_state_key_names_regions_and_backend_and_is_built_once",),
    ),
    Mutation(
        name="a re-pricing round's eager blocks run compiled",
        path="compile_callback/run.py",
        old="                self._reprice_stance = torch.compiler.set_stance(\"force_eager\")  # ended in after_batch / release\n",
        new="                pass\n",
        tests=("tests/test_reprice.py::test_a_frozen_plan_is_repriced_with_eager_beside_it",),
    ),
    Mutation(
        name="a trial does not wait for its background compile",
        path="compile_callback/planner.py",
        old="            while batches % every or not self.agree_all(child.done() if child is not None else True):\n",
        new="            while False:\n",
        tests=("tests/test_background.py::test_a_candidate_compiles_in_a_child_while_training_goes_on_eagerly",),
    ),
    Mutation(
        name="a module that does not pickle ends the fit instead of compiling in-process",
        path="compile_callback/planner.py",
        old="            except Unavailable as error:\n",
        new="            except KeyError as error:\n",
        tests=("tests/test_background.py::test_a_module_that_does_not_pickle_is_compiled_in_process",),
    ),
    Mutation(
        name="the anatomy samples on CUDA by default",
        path="compile_callback/run.py",
        old="    return anatomy if anatomy is not None else device.type != \"cuda\"\n",
        new="    return anatomy if anatomy is not None else True\n",
        tests=("tests/test_options.py::test_the_anatomy_samples_on_cpu_by_default_and_on_cuda_only_when_asked",),
    ),
    Mutation(
        name="the in-fit A/B alternates its blocks ABAB (a drift favours one side)",
        path="benchmarks/measure.py",
        old="        return block % 4 in (0, 3)\n",
        new="        return block % 2 == 0\n",
        tests=("tests/benchmarks/test_smoke.py::test_an_in_fit_ab_runs_abba_blocks_after_the_steady_window_and_is_timed_apart",),
    ),
    Mutation(
        name="a disturbed CUDA-graph control window is not timed again",
        path="compile_callback/planner.py",
        old="        while windows < CONTROL_WINDOWS and not self._by_shape:\n",
        new="        while windows < 1 and not self._by_shape:\n",
        tests=("tests/test_mode_trial.py::test_a_disturbed_control_window_is_timed_again_and_the_quickest_prices_the_trial",),
    ),
    Mutation(
        name="a re-timed control window is used whether or not it was quicker",
        path="compile_callback/planner.py",
        old="            if self.agree(self.timer.median_ms(retimed, wait=True) < self.timer.median_ms(best, wait=True)):\n",
        new="            if True:\n",
        tests=("tests/test_mode_trial.py::test_control_windows_stop_at_three_and_the_quickest_prices_the_trial",),
    ),
    Mutation(
        name="resume records the saved plan but never compiles it",
        path="compile_callback/planner.py",
        old="            compile_region(region, options, on_error=self._failed)\n            self.regions.append(region)\n",
        new="            self.regions.append(region)\n",
        tests=("tests/test_resume.py",),
    ),
    Mutation(
        name="a failing compiled call is rerun eagerly twice",
        path="compile_callback/torch_internals.py",
        old="            on_error(module, error)\n            return module(*args, **kwargs)\n",
        new="            on_error(module, error)\n            module(*args, **kwargs)\n            return module(*args, **kwargs)\n",
        tests=(
            "tests/test_faults.py::test_a_failing_call_is_rerun_eagerly_once_leaving_the_state_of_an_eager_run",
            "tests/test_faults.py::test_a_call_failing_after_verification_is_rerun_once_in_an_auto_fit",
        ),
    ),
    Mutation(
        name="compile/* scalars no longer logged every log_every_n_steps",
        path="compile_callback/callback.py",
        old="            self._last_logged_step = step\n            telemetry.log_scalars(trainer.loggers, self.run.metrics(), step=step)\n",
        new="            self._last_logged_step = step\n",
        tests=("tests/test_cadence.py",),
    ),
    Mutation(
        name="verification stops restoring buffers",
        path="compile_callback/verify.py",
        old="                    buffer.copy_(buffers[name])\n",
        new="                    pass\n",
        tests=(
            "tests/test_auto.py::test_verification_changes_nothing",
            "tests/test_faults.py::test_a_call_failing_after_verification_is_rerun_once_in_an_auto_fit",
        ),
    ),
    Mutation(
        name="verify_tolerance is ignored (tolerance by dtype)",
        path="compile_callback/run.py",
        old="                tolerance=config.verify_tolerance,\n",
        new="                tolerance=None,\n",
        tests=("tests/test_options.py::test_verify_tolerance_decides_which_error_passes",),
    ),
    Mutation(
        name="report=False still prints the table and writes compile_report.json",
        path="compile_callback/callback.py",
        old="        if not self.config.report:\n            return\n        telemetry.log_report_text",
        new="        telemetry.log_report_text",
        tests=("tests/test_options.py::test_report_false_writes_and_prints_nothing",),
    ),
    Mutation(
        name="options= never reaches torch.compile",
        path="compile_callback/regions.py",
        old='            kwargs["options"] = dict(self.options)\n',
        new="            pass\n",
        tests=("tests/test_options.py::test_options_reach_the_backend",),
    ),
    Mutation(
        name="max_trials is not a limit",
        path="compile_callback/planner.py",
        old="            if trials >= self.max_trials:\n",
        new="            if False:\n",
        tests=("tests/test_options.py::test_max_trials_stops_the_trials",),
    ),
    Mutation(
        name="pad_short_batch='pad' is not passed to the collate",
        path="compile_callback/padding.py",
        old='            short_batch=self.short_batch if batch_size else "keep",\n',
        new='            short_batch="keep",\n',
        tests=("tests/test_options.py::test_pad_short_batch_pad_fills_the_last_batch",),
    ),
    Mutation(
        name="the custom-scalars layout is never written",
        path="compile_callback/telemetry.py",
        old="        writer.add_custom_scalars(custom_scalars_layout())\n",
        new="        pass\n",
        tests=("tests/test_tensorboard.py::test_several_loggers_get_scalars_and_only_tensorboard_gets_views",),
    ),
    Mutation(
        name="under DDP, churn is agreed at epoch ends only",
        path="compile_callback/run.py",
        old='every_rank_here = self.config.on_recompile != "warn" and self.batch_index % self.env.log_every == 0',
        new="every_rank_here = False",
        tests=("tests/test_ddp.py::test_churn_on_one_rank_is_agreed_within_the_epoch_reverts_everywhere_and_is_reported_per_rank",),
    ),
    Mutation(
        name="a second fit of the same callback starts from the first fit's state",
        path="compile_callback/callback.py",
        old="        self.run = CompileRun(self.config, backend, self._environment(trainer))\n",
        new="        self.run = self.run or CompileRun(self.config, backend, self._environment(trainer))\n",
        tests=("tests/test_resume.py::test_one_callback_through_two_fits_decides_alike_in_each",),
    ),
    Mutation(
        name="the anatomy's profiler samples print torch's profiler_start/stop lines",
        path="compile_callback/anatomy.py",
        old="        os.dup2(null, 2)\n        yield\n",
        new="        yield\n",
        tests=("tests/test_anatomy.py::test_the_anatomy_samples_print_nothing_a_users_profiler_would",),
    ),
    Mutation(
        name="the recompile limit raised for padding buckets stays raised after fit",
        path="compile_callback/run.py",
        old="            torch_internals.set_recompile_limit(self.previous_recompile_limit)\n",
        new="            pass\n",
        tests=("tests/test_process_state.py::test_a_padded_fit_leaves_the_process_as_it_found_it",),
    ),
    Mutation(
        name="dynamo's compile-event callbacks stay installed after fit",
        path="compile_callback/watch.py",
        old="            torch_internals.remove_compile_hooks(self._handles)\n",
        new="            pass\n",
        tests=("tests/test_process_state.py::test_a_fit_that_reverts_a_region_leaves_the_process_and_the_module_as_they_were",),
    ),
    Mutation(
        name="validation compiles its no_grad graph whether or not it repays",
        path="compile_callback/run.py",
        old="        why = self._validation_stays_eager(batches, every, sanity_check=sanity_check)\n",
        new="        why = None\n",
        tests=("tests/test_validation_payback.py",),
    ),
    Mutation(
        name="validation never compiles",
        path="compile_callback/run.py",
        old="        if saving_s > cost_s:\n            return None\n",
        new="",
        tests=("tests/test_validation_payback.py::test_a_validation_that_repays_compiles_its_graph",),
    ),
    Mutation(
        name="compile/stall_s leaves out the steps that compiled",
        path="compile_callback/run.py",
        old="            self._add_stall(\"compiling_steps_s\", max(0.0, host_ms - (self.timer.median_ms(EAGER) or 0.0)) / 1e3)\n",
        new="            pass\n",
        tests=("tests/test_stall.py",),
    ),
    Mutation(
        name="the whole model always goes first, however short the run",
        path="compile_callback/payback.py",
        old="    if net(whole[0]) >= 0:\n",
        new="    if True:\n",
        tests=("tests/test_payback.py",),
    ),
    Mutation(
        name="a candidate that even the prior cannot repay is tried anyway",
        path="compile_callback/planner.py",
        old="        elif costs.rate is not None and current_ms:\n",
        new="        elif costs.known and current_ms:\n",
        tests=("tests/test_payback.py::test_a_candidate_even_the_prior_cannot_repay_is_not_tried",),
    ),
    Mutation(
        name="a compile from a warm cache prices a cold one",
        path="compile_callback/payback.py",
        old="            return max(prior or 0.0, self._rate_of(self.warm))\n",
        new="            return self._rate_of(self.warm)\n",
        tests=("tests/test_payback.py",),
    ),
    Mutation(
        name="the CUDA-graph trial is tried however little the batches left could save",
        path="compile_callback/payback.py",
        old="        if self.saving_s >= self.cost_s:\n",
        new="        if True:\n",
        tests=("tests/test_payback.py",),
    ),
    Mutation(
        name="CUDA graphs priced at the launch-bound share however fast the host issues the kept step",
        path="compile_callback/payback.py",
        old="    if issue_ms is None:\n        return GRAPH_SAVED_SHARE\n",
        new="    if True:\n        return GRAPH_SAVED_SHARE\n",
        tests=("tests/test_payback.py::test_cuda_graphs_are_priced_low_where_the_host_issues_the_kept_step_ahead_of_the_device",),
    ),
    Mutation(
        name="CUDA graphs priced by a cliff at ISSUE_BOUND_SHARE rather than a ramp to the device's pace",
        path="compile_callback/payback.py",
        old="    return GRAPH_SAVED_SHARE_DEVICE_BOUND + min(1.0, max(0.0, where)) * span\n",
        new="    return GRAPH_SAVED_SHARE_DEVICE_BOUND + (where > 0) * span\n",
        tests=("tests/test_payback.py::test_cuda_graphs_near_the_devices_pace_are_priced_between_the_two_shares",),
    ),
    Mutation(
        name="a group of blocks parks the optimizer's state for its verification",
        path="compile_callback/planner.py",
        old="        unparked = len(region.modules) >= GROUP_UNPARKED\n",
        new="        unparked = False\n",
        tests=("tests/test_verify.py::test_a_group_of_blocks_is_verified_with_the_optimizers_state_left_in_place",),
    ),
    Mutation(
        name="a group of blocks parks the last step's gradients for its verification",
        path="compile_callback/planner.py",
        old="                in_host_memory([] if unparked else self._between_steps()):\n",
        new="                in_host_memory(self._between_steps(optimizer=not unparked)):\n",
        tests=("tests/test_verify.py::test_a_group_of_blocks_is_verified_with_the_optimizers_state_left_in_place",),
    ),
    Mutation(
        name="a group of two or three blocks verified with the optimizer's state left in place",
        path="compile_callback/planner.py",
        old="        unparked = len(region.modules) >= GROUP_UNPARKED\n",
        new="        unparked = len(region.modules) >= 2\n",
        tests=("tests/test_verify.py::test_a_group_of_blocks_is_verified_with_the_optimizers_state_left_in_place",),
    ),
    Mutation(
        name="every region verified with the optimizer's state left in place",
        path="compile_callback/planner.py",
        old="        unparked = len(region.modules) >= GROUP_UNPARKED\n",
        new="        unparked = True\n",
        tests=("tests/test_verify.py::test_a_group_of_blocks_is_verified_with_the_optimizers_state_left_in_place",),
    ),
    Mutation(
        name="the profiled step that holds inputs is timed with the others",
        path="compile_callback/profile.py",
        old="                if step > first:\n",
        new="                if step >= 0:\n",
        tests=("tests/test_payback.py",),
    ),
    Mutation(
        name="verification compares sharded (DTensor) gradients as they are",
        path="compile_callback/verify.py",
        old="    return tensor.to_local() if isinstance(tensor, DTensor) else tensor\n",
        new="    return tensor\n",
        tests=("tests/test_sharded.py",),
    ),
    Mutation(
        name="a decision's compile cache state is read before the trial compiled anything",
        path="compile_callback/planner.py",
        old="        compile_seconds, compile_cache = self._compiled_since(compile_before, [candidate.region.name])\n        how = ",
        new="        compile_seconds, compile_cache = self._compiled_since(self._compile_counts([candidate.region.name]), [candidate.region.name])\n        how = ",
        tests=("tests/test_auto.py::test_warm_restart_skips_trials_and_compiles_faster",),
    ),
    Mutation(
        name="a loaded plan's decisions keep the cache state of the fit that made them",
        path="compile_callback/planner.py",
        old="                decision.compile_cache = cache_state(hits, misses)\n",
        new="                pass\n",
        tests=("tests/test_auto.py::test_warm_restart_skips_trials_and_compiles_faster",),
    ),
    Mutation(
        name="under DDP, each rank keeps its own re-pricing round",
        path="compile_callback/run.py",
        old="        if self.env.multi_process:  # rank 0's timings price the plan, and time the next round, on every rank\n",
        new="        if False:\n",
        tests=("tests/test_ddp.py::test_report_counts_every_rank_and_explains_ddp_graph_splits",),
    ),
    Mutation(
        name="compile cost counts Identity leaves",
        path="compile_callback/payback.py",
        old="               if next(m.children(), None) is None and not isinstance(m, nn.Identity))\n",
        new="               if next(m.children(), None) is None)\n",
        tests=("tests/test_payback.py::test_a_group_of_repeated_blocks_counts_one_block",),
    ),
    Mutation(
        name="the accuracy rule's floor flat at tol/10, as PyTorch's (a small gradient 1% off passes)",
        path="compile_callback/accuracy.py",
        old="tolerance / 10 * min(1.0, rms)",
        new="tolerance / 10",
        tests=("tests/test_verify.py::test_an_analytically_zero_gradient_passes_on_its_own_noise_and_a_small_real_one_one_percent_off_fails",),
    ),
    Mutation(
        name="a decision does not say which tensor its max relative error is from",
        path="compile_callback/planner.py",
        old='                "error_in": verdict.where if checked else None, "verified": self._verified(verdict)}\n',
        new='                "error_in": None, "verified": self._verified(verdict)}\n',
        tests=("tests/test_verify.py::test_bf16_rule_on_cpu_keeps_a_faithful_compile_and_rejects_a_wrong_one",),
    ),
    Mutation(
        name="the telemetry verdict trusts eager's median however much its own windows wandered",
        path="benchmarks/table.py",
        old="    unsteady = (drift_verdict(drift) or wander_verdict(wander)) if passed is not None else None\n",
        new="    unsteady = drift_verdict(drift) if passed is not None else None\n",
        tests=("tests/benchmarks/test_checks.py::test_eager_wandering_within_its_own_run_hands_the_telemetry_verdict_to_the_in_fit_ab",),
    ),
    Mutation(
        name="an in-fit A/B whose cycles disagree answers nothing even where every cycle gives one verdict",
        path="benchmarks/table.py",
        old='        every = _every_cycle(telemetry.get("reported"), cycles)\n',
        new="        every = None\n",
        tests=("tests/benchmarks/test_checks.py::test_an_in_fit_ab_whose_cycles_disagree_answers_where_every_cycle_gives_the_same_verdict",),
    ),
    Mutation(
        name="an in-fit A/B's cycles read as met where any one of them agrees with the report",
        path="benchmarks/table.py",
        old="    if all(abs(error) <= checks.TELEMETRY_TOLERANCE for error in errors):\n",
        new="    if any(abs(error) <= checks.TELEMETRY_TOLERANCE for error in errors):\n",
        tests=("tests/benchmarks/test_checks.py::test_an_in_fit_ab_whose_cycles_disagree_answers_where_every_cycle_gives_the_same_verdict",),
    ),
    Mutation(
        name="an in-fit A/B's cycles answer though its pooled medians give the other verdict",
        path="benchmarks/table.py",
        old="        if every is None or every != in_fit:  # the ratio of pooled medians need not lie between the cycles\n",
        new="        if every is None:\n",
        tests=("tests/benchmarks/test_checks.py::test_an_in_fit_ab_whose_cycles_disagree_answers_where_every_cycle_gives_the_same_verdict",),
    ),
    Mutation(
        name="a report below every in-fit A/B cycle read as inconclusive",
        path="benchmarks/table.py",
        old="    if min(errors) > checks.TELEMETRY_TOLERANCE or max(errors) < -checks.TELEMETRY_TOLERANCE:\n",
        new="    if min(errors) > checks.TELEMETRY_TOLERANCE:\n",
        tests=("tests/benchmarks/test_checks.py::test_an_in_fit_ab_whose_cycles_disagree_answers_where_every_cycle_gives_the_same_verdict",),
    ),
    Mutation(
        name="every in-fit A/B cycle answers alone on a steady host (the variants' A/B ignored)",
        path="benchmarks/table.py",
        old="        return _verdict(every if passed is None else passed and every)\n",
        new="        return _verdict(every)\n",
        tests=("tests/benchmarks/test_checks.py::test_an_in_fit_ab_whose_cycles_disagree_answers_where_every_cycle_gives_the_same_verdict",),
    ),
    Mutation(
        name="the same-batches figure over the wrong blocks (compiled taken for eager)",
        path="benchmarks/checks.py",
        old="        (eager if block % 4 in (0, 3) else compiled).extend(steps[start + 1:start + reprice.BLOCK])\n",
        new="        (eager if block % 4 in (1, 2) else compiled).extend(steps[start + 1:start + reprice.BLOCK])\n",
        tests=("tests/benchmarks/test_checks.py::test_the_reported_figure_is_also_timed_by_the_harness_over_its_own_re_pricing_round",),
    ),
    Mutation(
        name="the first-steps wall time held to eager's on every workload, not 1.02x",
        path="benchmarks/table.py",
        old="    passed = callback_wall < eager_wall if below else callback_wall <= SPEC_WALL_RATIO * eager_wall\n",
        new="    passed = callback_wall < eager_wall\n",
        tests=("tests/benchmarks/test_checks.py::test_the_first_steps_wall_time_is_held_to_the_specs_bound_for_each_workload",),
    ),
    Mutation(
        name="GPT-2's first-steps wall time allowed 1.02x eager's",
        path="benchmarks/table.py",
        old="    passed = callback_wall < eager_wall if below else callback_wall <= SPEC_WALL_RATIO * eager_wall\n",
        new="    passed = callback_wall <= SPEC_WALL_RATIO * eager_wall\n",
        tests=("tests/benchmarks/test_checks.py::test_the_first_steps_wall_time_is_held_to_the_specs_bound_for_each_workload",),
    ),
    Mutation(
        name="the first-steps wall time answered by a run whose compile caches were disabled",
        path="benchmarks/table.py",
        old="    if _caches_disabled(caches):\n        return Verdict(workload, target, f\"{callback_wall:.1f} s{CACHES_DISABLED}\"",
        new="    if False:\n        return Verdict(workload, target, f\"{callback_wall:.1f} s{CACHES_DISABLED}\"",
        tests=("tests/benchmarks/test_checks.py::test_the_first_steps_wall_time_is_answered_by_runs_with_the_compile_caches_on",),
    ),
    Mutation(
        name="a variant that matched its rival on a slower host than the rival's is called met whichever way the host went",
        path="benchmarks/table.py",
        old="    if passed and ran_earlier and drift > 1:\n",
        new="    if passed and ran_earlier:\n",
        tests=("tests/benchmarks/test_smoke.py::test_a_win_the_drift_worked_against_stands",),
    ),
    Mutation(
        name="the frozen plan times every steady step (an event pair each)",
        path="compile_callback/run.py",
        old="        return self._plan_step_sampled(PLAN_TIMED_FIRST, PLAN_TIMED_EVERY)\n",
        new="        return True\n",
        tests=("tests/test_timing.py::test_the_frozen_plan_times_a_sample_of_its_steps_in_one_shape_and_every_step_in_several",),
    ),
    Mutation(
        name="warm-up batches timed though their time is discarded (an event and a walk of the batch each)",
        path="compile_callback/run.py",
        old="        if self._label == WARMUP:\n            return False\n",
        new="",
        tests=("tests/test_timing.py::test_warm_up_batches_are_not_timed_and_the_eager_baseline_is",),
    ),
    Mutation(
        name="batches trained while a child compiles all take the full path",
        path="compile_callback/run.py",
        old="        self._waiting = not self._steady and self._waits_quietly(compiled_now)\n",
        new="",
        tests=("tests/test_background.py::test_batches_trained_while_the_child_compiles_poll_it_only_every_so_often",),
    ),
    Mutation(
        name="batches trained while a child compiles never poll it again",
        path="compile_callback/run.py",
        old="self._waiting and time.perf_counter() - self._full_at < WAITING_POLL_S",
        new="self._waiting",
        tests=("tests/test_background.py::test_batches_trained_while_the_child_compiles_poll_it_only_every_so_often",),
    ),
    Mutation(
        name="a waiting batch is quiet under DDP too, where the ranks meet at the planner's batches",
        path="compile_callback/planner.py",
        old="        return self.compiling_in_background is not None and self.processes == 1\n",
        new="        return self.compiling_in_background is not None\n",
        tests=("tests/test_background.py::test_only_one_process_waits_for_a_child_quietly",),
    ),
    Mutation(
        name="a quiet step that compiled is not recorded until a later full step",
        path="compile_callback/run.py",
        old="        if quiet and self.watch.idle:",
        new="        if quiet:",
        tests=("tests/test_timing.py::test_steady_steps_take_the_quiet_path_and_a_compile_in_one_is_still_recorded",),
    ),
    Mutation(
        name="a quiet step leaves the watch on the last full step's global step",
        path="compile_callback/run.py",
        old="        self.watch.step = self._step  # type: ignore[union-attr]",
        new="        pass  # type: ignore[union-attr]",
        tests=("tests/test_timing.py::test_steady_steps_take_the_quiet_path_and_a_compile_in_one_is_still_recorded",),
    ),
    Mutation(
        name="the frozen plan samples its step times where batches come in several shapes",
        path="compile_callback/run.py",
        old="        if self._label != COMPILED or self._keys_wanted():\n            return True\n",
        new="        if self._label != COMPILED:\n            return True\n",
        tests=("tests/test_timing.py::test_the_frozen_plan_times_a_sample_of_its_steps_in_one_shape_and_every_step_in_several",),
    ),
    Mutation(
        name="the trial re-verifies even where its compile came whole from the child's cache",
        path="compile_callback/planner.py",
        old="        if checked is None or not self.verify or len(region.modules) != 1 or self.profiler is None:\n",
        new="        if True:\n",
        tests=("tests/test_background.py::test_the_childs_verification_stands_where_the_trial_compiled_from_its_cache",),
    ),
    Mutation(
        name="the child's verification stands even where the trial compiled anew",
        path="compile_callback/planner.py",
        old='        if not loaded.passed or self._compiled_since(before, names)[1] != "warm":\n',
        new="        if not loaded.passed:\n",
        tests=("tests/test_background.py::test_a_candidate_compiles_in_a_child_while_training_goes_on_eagerly",),
    ),
    Mutation(
        name="the child does not carry the parent's fp32_precision (part of Inductor's cache key)",
        path="compile_callback/background.py",
        old='    for path, value in flags.get("fp32_precision", {}).items():\n',
        new='    for path, value in {}.items():\n',
        tests=("tests/test_background.py::test_the_childs_settings_leave_fp32_precision_as_the_parent_has_it",),
    ),
    Mutation(
        name="a trial's set-up batch is not timed by piece",
        path="compile_callback/planner.py",
        old='        with timed_stage(seconds, "verification in all", self.device), \\\n',
        new="        with \\\n",
        tests=("tests/test_stall.py::test_a_trials_set_up_batch_is_timed_by_piece",),
    ),
    Mutation(
        name="a part ready sooner in the background never goes before the whole model",
        path="compile_callback/payback.py",
        old="    if best is None or gain(best) <= 0:\n",
        new="    if True:\n",
        tests=("tests/test_payback.py::test_in_the_background_a_part_ready_much_sooner_goes_first_and_the_whole_model_after_it",
               "tests/test_payback.py::test_the_whole_model_prepared_after_a_kept_part_replaces_it"),
    ),
    Mutation(
        name="a part the whole model replaced stays kept beside it",
        path="compile_callback/planner.py",
        old="                mark_replaced(self.decisions, part, candidate.name)\n",
        new="",
        tests=("tests/test_payback.py::test_the_whole_model_prepared_after_a_kept_part_replaces_it",),
    ),
    Mutation(
        name="a whole model not kept after a part leaves the part eager",
        path="compile_callback/planner.py",
        old="            revert_region(candidate.region)\n            _put_back(set_aside)\n            reason = (\n",
        new="            revert_region(candidate.region)\n            reason = (\n",
        tests=("tests/test_payback.py::test_a_whole_model_no_faster_than_the_kept_part_leaves_the_part_compiled",),
    ),
    Mutation(
        name="the launcher starts no standby for the next child",
        path="compile_callback/background.py",
        old=("            self.standby = Standby(waiting.preload, write_bytecode=True,  # its imports wait on no one\n"
             "                                   started=\"as the child before it was handed over\")\n"),
        new="            pass\n",
        tests=("tests/test_background.py::test_the_next_childs_interpreter_is_readied_only_where_it_will_be_used_or_writes_bytecode",
               "tests/test_payback.py::test_the_whole_model_prepared_after_a_kept_part_replaces_it"),
    ),
    Mutation(
        name="the launcher readies a next child's interpreter after every hand-over (used or not)",
        path="compile_callback/background.py",
        old=("        if waiting is not None and child.standby and (\n"
             "                another or (bytecode_unwritten() and not waiting.precompiles)):\n"),
        new="        if waiting is not None and child.standby:\n",
        tests=("tests/test_background.py::test_a_candidate_compiles_in_a_child_while_training_goes_on_eagerly",
               "tests/test_background.py::test_the_next_childs_interpreter_is_readied_only_where_it_will_be_used_or_writes_bytecode"),
    ),
    Mutation(
        name="the launcher readies a bytecode writer beside a child that is precompiling the same bytecode",
        path="compile_callback/background.py",
        old="                another or (bytecode_unwritten() and not waiting.precompiles)):\n",
        new="                another or bytecode_unwritten()):\n",
        tests=("tests/test_background.py::test_the_next_childs_interpreter_is_readied_only_where_it_will_be_used_or_writes_bytecode",),
    ),
    Mutation(
        name="the search never says that the whole model's child follows the part's",
        path="compile_callback/planner.py",
        old="            whole_follows = not candidate.whole and any(c.whole for c in plan[index + 1:])\n",
        new="            whole_follows = False\n",
        tests=("tests/test_payback.py::test_the_whole_model_prepared_after_a_kept_part_replaces_it",),
    ),
    Mutation(
        name="a standby for bytecode is started though torch's bytecode is written",
        path="compile_callback/background.py",
        old="            and not os.path.exists(boot.cached_in(BYTECODE_DIR, torch.__file__)))\n",
        new="            )\n",
        tests=("tests/test_background.py::test_the_next_childs_interpreter_is_readied_only_where_it_will_be_used_or_writes_bytecode",),
    ),
    Mutation(
        name="an in-fit A/B whose cycles disagree still judges the report",
        path="benchmarks/table.py",
        old="    if in_fit is not None and cycles and cycles[1] > cycles[0] * (1 + checks.TELEMETRY_TOLERANCE):\n",
        new="    if False:\n",
        tests=("tests/benchmarks/test_checks.py::test_an_in_fit_ab_whose_cycles_disagree_answers_nothing",),
    ),
    Mutation(
        name="the gpt2 compiling target leaves out a background child's seconds",
        path="benchmarks/table.py",
        old="            compile_s += child_s or 0.0\n",
        new="            compile_s += 0.0\n",
        tests=("tests/benchmarks/test_smoke.py::test_targets_are_judged_on_the_callback_variant",),
    ),
    Mutation(
        name="a trial is priced at its compile alone, not its set-up",
        path="compile_callback/planner.py",
        old="                costs.observe_check(setup[\"verification in all\"] + setup.get(\"memory release\", 0.0)\n",
        new="                costs.observe_check(0.0 * setup[\"verification in all\"] + setup.get(\"memory release\", 0.0)\n",
        tests=("tests/test_auto.py::test_a_skipped_trial_is_priced_with_the_set_up_the_tried_ones_took",),
    ),
    Mutation(
        name="the CUDA-graph trial's price leaves out the run's set-up",
        path="compile_callback/payback.py",
        old="        return self.compile_s + self.check_s  # as CompileCosts.trial_seconds\n",
        new="        return self.compile_s\n",
        tests=("tests/test_payback.py::test_a_trials_set_up_beyond_its_compile_is_priced_too",),
    ),
    Mutation(
        name="children compile torch's sources again where no bytecode is written",
        path="compile_callback/background.py",
        old="    env = bytecode_env(dict(os.environ), installed=_installed_bytecode(), write=write_bytecode)\n",
        new="    env = dict(os.environ)\n",
        tests=("tests/test_background.py::test_children_cache_bytecode_of_their_own_only_where_none_is_written",),
    ),
    Mutation(
        name="the fit's first standby writes bytecode on the critical path",
        path="compile_callback/background.py",
        old="    def __init__(self, preload: tuple[str, ...] = (), *, write_bytecode: bool = False,\n",
        new="    def __init__(self, preload: tuple[str, ...] = (), *, write_bytecode: bool = True,\n",
        tests=("tests/test_background.py::test_children_cache_bytecode_of_their_own_only_where_none_is_written",),
    ),
    Mutation(
        name="a plan cut short by the run's length answers the steady-speed targets",
        path="benchmarks/table.py",
        old="        short = cut_short if steady_speed else None\n",
        new="        short = None\n",
        tests=("tests/benchmarks/test_smoke.py::test_a_plan_cut_short_by_the_runs_length_answers_no_steady_speed_target",),
    ),
    Mutation(
        name="a re-pricing round's cycles not capped at MAX_CYCLES",
        path="compile_callback/reprice.py",
        old="    return min(fits, max(MIN_CYCLES, min(MAX_CYCLES, paid)))\n",
        new="    return min(fits, max(MIN_CYCLES, paid))\n",
        tests=("tests/test_reprice.py::test_a_round_runs_as_many_cycles_as_its_budget_allows_over_what_is_left_of_the_run",),
    ),
    Mutation(
        name="a re-pricing round's cycles priced by eager's whole step, not its excess over the plan",
        path="compile_callback/reprice.py",
        old="    excess_ms = 2 * BLOCK * max(0.0, eager_ms - compiled_ms)\n",
        new="    excess_ms = 2 * BLOCK * eager_ms\n",
        tests=("tests/test_reprice.py::test_a_round_runs_as_many_cycles_as_its_budget_allows_over_what_is_left_of_the_run",),
    ),
    Mutation(
        name="a round of fewer cycles than the price it would replace runs anyway",
        path="compile_callback/reprice.py",
        old="        if cycles < MIN_CYCLES or (latest is not None and cycles < len(latest.cycles)):\n",
        new="        if cycles < MIN_CYCLES:\n",
        tests=("tests/test_reprice.py::test_a_round_of_fewer_cycles_than_the_price_it_would_replace_is_put_off",
               "tests/test_reprice.py::test_the_run_sizes_each_round_by_what_is_left_of_it"),
    ),
    Mutation(
        name="a resumed run's re-pricing rounds not saved in the checkpoint",
        path="compile_callback/run.py",
        old='            "repricer": self.repricer.state_dict(),\n',
        new="",
        tests=("tests/test_reprice.py::test_a_resumed_run_keeps_its_rounds_price_and_schedule",),
    ),
    Mutation(
        name="a round of more cycles than the batches left",
        path="compile_callback/reprice.py",
        old="    return min(fits, max(MIN_CYCLES, min(MAX_CYCLES, paid)))\n",
        new="    return max(MIN_CYCLES, min(MAX_CYCLES, paid))\n",
        tests=("tests/test_reprice.py::test_a_round_runs_as_many_cycles_as_its_budget_allows_over_what_is_left_of_the_run",),
    ),
    Mutation(
        name="the rounds' spacing leaves out each eager block's untimed first step",
        path="compile_callback/reprice.py",
        old="        excess_ms = max(0.0, sum(eager) - sum(compiled) * len(eager) / len(compiled)) * BLOCK / per_block\n",
        new="        excess_ms = max(0.0, sum(eager) - sum(compiled) * len(eager) / len(compiled))\n",
        tests=("tests/test_reprice.py::test_a_round_runs_abba_blocks_and_waits_its_budget_before_the_next",),
    ),
    Mutation(
        name="rounds that priced a plan the churn policy reverted still price it",
        path="compile_callback/run.py",
        old='            self._record(action, "reverted to eager: recompile churn")\n            self.repricer.plan_changed()\n',
        new='            self._record(action, "reverted to eager: recompile churn")\n',
        tests=("tests/test_recompiles.py::test_eager_policy_reverts_the_churning_region",),
    ),
    Mutation(
        name="the run sizes no round: every round two cycles",
        path="compile_callback/run.py",
        old="            if not self.repricer.size(self.batch_index, cycles):\n                return None\n",
        new="",
        tests=("tests/test_reprice.py::test_the_run_sizes_each_round_by_what_is_left_of_it",),
    ),
    Mutation(
        name="a round's low and high from its cycles' range whatever their number",
        path="compile_callback/timing.py",
        old="    while k + 1 <= (n + 1) // 2 and 2 * sum(math.comb(n, i) for i in range(k + 1)) / 2**n <= 1 - coverage:\n",
        new="    while False:\n",
        tests=("tests/test_timing.py::test_the_interval_of_a_median_narrows_as_values_grow_where_their_range_widens",
               "tests/benchmarks/test_checks.py::test_an_in_fit_ab_of_eight_cycles_answers_by_where_their_median_lies_not_by_its_outliers"),
    ),
    Mutation(
        name="the same-batches figure over two cycles whatever the round ran",
        path="benchmarks/checks.py",
        old='    cycles = figures.get("speedup_priced_cycles") or reprice.MIN_CYCLES  # rounds before 2026-12-04 ran two\n',
        new="    cycles = reprice.MIN_CYCLES\n",
        tests=("tests/benchmarks/test_checks.py::test_the_reported_figure_is_also_timed_by_the_harness_over_its_own_re_pricing_round",),
    ),
    Mutation(
        # Caught by the DDP timeout of the test (300 s): the ranks' rounds end apart and a collective is left unjoined.
        name="each DDP rank sizes its re-pricing rounds by its own timings",
        path="compile_callback/run.py",
        old="                why, cycles = self.env.broadcast((why, cycles), 0)\n",
        new="                why = self.env.broadcast(why, 0)\n",
        tests=("tests/test_ddp.py::test_report_counts_every_rank_and_explains_ddp_graph_splits",),
    ),
    Mutation(
        name="the plain loop compiles a fused optimizer's step as it is (dynamo skips its kernel)",
        path="benchmarks/runner.py",
        old="    optimizer = foreach_twin(optimizer)\n",
        new="",
        tests=("tests/benchmarks/test_smoke.py::test_the_compiled_optimizer_step_of_the_plain_loop_is_a_foreach_twin_and_compiles",),
    ),
    Mutation(
        name="the plain loop's trace profiles nothing",
        path="benchmarks/runner.py",
        old="                    trace.batch_start(device)\n",
        new="                    pass\n",
        tests=("tests/benchmarks/test_smoke.py::test_trace_steps_write_one_summary_per_variant_the_plain_loop_too",),
    ),
    Mutation(
        name="a caches-off run answers the cold-stall target",
        path="benchmarks/table.py",
        old="    if stall is not None and _caches_disabled(caches):\n",
        new="    if False:\n",
        tests=("tests/benchmarks/test_checks.py::test_the_cold_stall_is_answered_by_runs_with_the_compile_caches_on",),
    ),
    Mutation(
        name="gpuclock counts every sample of the run in each variant",
        path="benchmarks/diagnostics/gpuclock.py",
        old='        inside = [s for s in samples if start <= s["epoch"] <= end]\n',
        new="        inside = list(samples)\n",
        tests=("tests/benchmarks/test_gpuclock.py",),
    ),
    Mutation(
        name="only reduce-overhead counts as CUDA graphs (max-autotune's trial interleaved, its pool unchecked)",
        path="compile_callback/regions.py",
        old='    return bool({**torch_internals.mode_options(mode), **(options or {})}.get("triton.cudagraphs"))\n',
        new='    return mode == "reduce-overhead"\n',
        tests=("tests/test_mode_trial.py",),
    ),
    Mutation(
        name="the CUDA-graph trial puts a mode beside the user's Inductor options",
        path="compile_callback/regions.py",
        old='        if self.options:\n            return dataclasses.replace(self, options={**self.options, "triton.cudagraphs": True})\n',
        new="",
        tests=("tests/test_mode_trial.py",),
    ),
    Mutation(
        name="a resumed plan forgets the options its regions were compiled with",
        path="compile_callback/planner.py",
        old='            if "options" in item:',
        new='            if False:',
        tests=("tests/test_mode_trial.py",),
    ),
    Mutation(
        name="the kept plan's CUDA-graph trial ignores max_trials",
        path="compile_callback/planner.py",
        old="and not tried_graphs and trials >= self.max_trials:",
        new="and not tried_graphs and False:",
        tests=("tests/test_mode_trial.py",),
    ),
    Mutation(
        name="the user's triton.cudagraphs=False is overridden by the planner's CUDA-graph trial",
        path="compile_callback/regions.py",
        old='self.cuda_graphs or "triton.cudagraphs" in (self.options or {}):',
        new="self.cuda_graphs:",
        tests=("tests/test_mode_trial.py",),
    ),
    Mutation(
        name="dynamic=False with pad: no bucket budget, no raised recompile limit",
        path="compile_callback/run.py",
        old="self.config.dynamic is True or not plan.edges:",
        new="self.config.dynamic is not None or not plan.edges:",
        tests=("tests/test_padding.py::test_padding_from_the_first_batch_compiles_one_static_graph_per_bucket",),
    ),
    Mutation(
        name="the plan's collate raises on a size past its edges (a sample the census did not read fails the fit)",
        path="compile_callback/padding.py",
        old='            oversize="pad",\n',
        new='',
        tests=("tests/test_padding.py::test_a_size_the_census_did_not_read_is_padded_past_the_edges_not_a_failed_fit",),
    ),
    Mutation(
        name="a checkpoint's plan chosen under other arguments is applied on resume",
        path="compile_callback/run.py",
        old="        if saved is not None and saved != now:",
        new="        if False:",
        tests=("tests/test_resume.py::test_a_plan_chosen_under_other_arguments_is_chosen_again_on_resume",),
    ),
    Mutation(
        name="an old plan's mode is compiled beside the run's options (torch.compile refuses both)",
        path="compile_callback/planner.py",
        old='            elif options.mode not in (None, "default") and options.options:',
        new="            elif False:",
        tests=("tests/test_resume.py::test_a_mode_saved_before_plans_kept_their_options_compiles_as_options_beside_the_runs",),
    ),
    Mutation(
        name="no stand-in for the whole model where training_step calls self.model itself",
        path="compile_callback/planner.py",
        old='        holder = self.agree(None if "" in self.profiler.seen else self._step_holder(forward, total))\n',
        new="        holder = None\n",
        tests=("tests/test_third_party.py::test_where_training_step_calls_self_model_itself_self_model_is_tried_as_the_whole_model",),
    ),
    Mutation(
        name="without the root's forward, shares are of the top-level children only (a small head holds the step)",
        path="compile_callback/planner.py",
        old='        total = forward.get("") or sum(forward.get(n, 0.0) for n in outer) or 1e-9\n',
        new='        total = forward.get("") or sum(v for k, v in forward.items() if k and "." not in k) or 1e-9\n',
        tests=("tests/benchmarks/test_issueprobe.py::test_the_planner_finds_no_whole_model_to_try_and_tries_the_blocks",),
    ),
    Mutation(
        name="token_type_ids left unpadded (BERT samples fail to collate)",
        path="compile_callback/collate.py",
        old='    "token_type_ids": "segments",\n',
        new="",
        tests=("tests/test_third_party.py::test_bert_samples_with_token_type_ids_are_padded_alike",),
    ),
    Mutation(
        name="tokens padded with 0 before a HF collator whose tokenizer pads with another id",
        path="compile_callback/padding.py",
        old="            pad_id=tokenizer_pad_id(inner),\n",
        new="",
        tests=("tests/test_third_party.py::test_padding_before_a_hf_language_modeling_collator_pads_with_its_tokenizers_pad_id",),
    ),
    Mutation(
        name="recompiles on a HF key/value cache get the generic fix",
        path="compile_callback/churn.py",
        old="    if HF_CACHE_SOURCE in cause:\n        return HF_CACHE_FIX\n",
        new="",
        tests=("tests/test_third_party.py::test_hf_blocks_recompiling_on_the_kv_cache_are_told_to_turn_the_cache_off",),
    ),
    Mutation(
        name="the root named where training_step does not call forward gets the torch.nn suggestion",
        path="compile_callback/report.py",
        old="        if region.is_compiled and region.name == MODEL and not",
        new="        if False and not",
        tests=("tests/test_third_party.py::test_the_whole_model_named_where_training_step_does_not_call_forward_is_said_so",),
    ),
    Mutation(
        name="(image, label) pairs need fields (padding not applied to torchvision/timm datasets)",
        path="compile_callback/collate.py",
        old='        if fields is None and _is_image_and_label(container, batch=what == "batch"):\n',
        new="        if False:\n",
        tests=("tests/test_third_party.py::test_pad_takes_timm_image_and_label_pairs_and_fills_the_short_last_batch",),
    ),
    Mutation(
        name="each rank picks its own whole-model stand-in (ranks' candidates differ)",
        path="compile_callback/planner.py",
        old='        holder = self.agree(None if "" in self.profiler.seen else self._step_holder(forward, total))\n',
        new='        holder = None if "" in self.profiler.seen else self._step_holder(forward, total)\n',
        tests=("tests/test_mode_trial.py::test_the_whole_model_stand_in_is_rank_zeros_on_every_rank",),
    ),
    Mutation(
        name="the search goes on after self.model, standing for the whole model, is kept",
        path="compile_callback/planner.py",
        old="        return bool(self._whole_names() & {r.name for r in self._kept})\n",
        new="        return any(r.name == MODEL for r in self._kept)\n",
        tests=("tests/test_auto.py::test_self_model_kept_as_the_whole_model_ends_the_search",),
    ),
    Mutation(
        name="a kept self.model stand-in covers nothing (coverage from the root's forward only)",
        path="compile_callback/planner.py",
        old="        if any(r.name == MODEL or r.name in self._whole_names() for r in self.regions):\n",
        new="        if any(r.name == MODEL for r in self.regions):\n",
        tests=("tests/test_auto.py::test_self_model_kept_as_the_whole_model_ends_the_search",),
    ),
    Mutation(
        name="rows of lists of ints (a datasets row) are not padded",
        path="compile_callback/collate.py",
        old="        samples = [self._with_tensors(sample) for sample in samples]\n",
        new="",
        tests=("tests/test_third_party.py::test_bert_samples_with_token_type_ids_are_padded_alike",),
    ),
    Mutation(
        name="named regions that made no graph report two eager medians' noise as a speedup",
        path="compile_callback/run.py",
        old='        if compiled_ms is not None and self.watch is not None and not self.watch.totals()["graphs"]:\n',
        new="        if False:\n",
        tests=("tests/test_third_party.py::test_the_whole_model_named_where_training_step_does_not_call_forward_is_said_so",),
    ),
    Mutation(
        name="CUDA graphs planned for a backend that has none",
        path="compile_callback/planner.py",
        old="self.options.mode is None and self.options.with_cuda_graphs() is not None\n",
        new="self.options.mode is None\n",
        tests=("tests/test_mode_trial.py",),
    ),
    Mutation(
        name="a HF block's unverifiable held cache not named",
        path="compile_callback/verify.py",
        old='return kind.__name__ if kind.__module__.startswith("transformers.cache_utils") else None\n',
        new="return None\n",
        tests=("tests/test_third_party.py::test_a_hf_block_held_with_its_kv_cache_is_not_verified_and_the_cache_fix_is_named",),
    ),
    Mutation(
        name="a tolerance without verification accepted",
        path="compile_callback/config.py",
        old="            if not self.verify:\n",
        new="            if False:\n",
        tests=("tests/test_callback.py::test_bad_arguments_are_refused_with_a_clear_message",),
    ),
    Mutation(
        name="a decision's reason cut at 300 characters, the fix named after the torch error lost",
        path="compile_callback/planner.py",
        old='            return f"{what}: {verdict.error}"',
        new='            return f"{what}: {verdict.error[:300]}"',
        tests=("tests/test_third_party.py::test_hf_reentrant_gradient_checkpointing_is_not_verified_and_the_fix_is_named",),
    ),
    Mutation(
        name="reentrant checkpointing's unverifiable replay not explained",
        path="compile_callback/verify.py",
        old='f" ({REENTRANT_CHECKPOINT_FIX})" if "use_reentrant=True" in str(error) else "")',
        new='"")',
        tests=("tests/test_third_party.py::test_hf_reentrant_gradient_checkpointing_is_not_verified_and_the_fix_is_named",),
    ),
    Mutation(
        name="a bf16-true model verified to fp32's tolerance (every compile refused)",
        path="compile_callback/verify.py",
        old="        dtype = compute_dtype(module)\n",
        new="        dtype = autocast_dtype() or torch.float32\n",
        tests=("tests/test_verify.py::test_a_model_trained_in_bf16_true_precision_is_verified_to_bf16s_tolerance",),
    ),
    Mutation(
        name="the float64 reference run in the compute dtype",
        path="compile_callback/verify.py",
        old="                    return _run(module, *torch_internals.tree_map(_widened, (args, kwargs)), take_outputs, state=state)",
        new="                    return _run(module, args, kwargs, take_outputs)",
        tests=("tests/test_verify.py::test_a_model_trained_in_bf16_true_precision_is_verified_to_bf16s_tolerance",
               "tests/test_verify.py::test_a_planted_error_in_one_gradient_is_rejected_with_the_tensor_named"),
    ),
    Mutation(
        name="random ops known by dropout layers only",
        path="compile_callback/verify.py",
        old="            draws = draws or eager.drew_random or numpy_draws\n",
        new="            draws = draws or numpy_draws\n",
        tests=("tests/test_verify.py::test_a_random_op_outside_dropout_layers_is_verified_under_the_same_random_numbers",),
    ),
    Mutation(
        name="the float64 reference draws its own random numbers",
        path="compile_callback/verify.py",
        old="                        stack.enter_context(torch_internals.random_draws_in_float32())",
        new="                        pass",
        tests=("tests/test_verify.py::test_a_planted_error_in_one_gradient_is_rejected_with_the_tensor_named",),
    ),
    Mutation(
        name="the accuracy rule's multiplier 10 for every tensor",
        path="compile_callback/accuracy.py",
        old="        m = NOISE_MULTIPLIER if off_eager.agree and eager_rmse >= rms else multiplier(dtype, size)\n",
        new="        m = NOISE_MULTIPLIER\n",
        tests=("tests/test_verify.py::test_the_rule_allows_compiled_the_multiplier_times_eagers_error_and_no_more",),
    ),
    Mutation(
        name="an analytically zero gradient judged without the noise multiplier",
        path="compile_callback/accuracy.py",
        old="        m = NOISE_MULTIPLIER if off_eager.agree and eager_rmse >= rms else multiplier(dtype, size)\n",
        new="        m = multiplier(dtype, size)\n",
        tests=("tests/test_verify.py::test_an_analytically_zero_gradient_passes_on_its_own_noise_and_a_small_real_one_one_percent_off_fails",),
    ),
    Mutation(
        name="a verification past tol rejects without asking the reference",
        path="compile_callback/verify.py",
        old="        if reference is None:\n",
        new="        if True:\n",
        tests=("tests/test_verify.py::test_an_analytically_zero_gradient_does_not_reject_a_correct_compile",),
    ),
    Mutation(
        name="a numerics failure paid for again in the other mode",
        path="compile_callback/planner.py",
        old="                self._numerics_refused[candidate.name] = options.mode_name\n",
        new="                pass\n",
        tests=("tests/test_auto.py::test_a_numerics_failure_is_not_paid_for_again_in_another_mode_and_its_compile_is_reported",),
    ),
    Mutation(
        name="a candidate rejected by verification reports no compile seconds",
        path="compile_callback/planner.py",
        old="""            self._decide(candidate, options, kept=False, reason=self._failure_reason(verdict),
                         compile_seconds=compile_seconds or None, compile_cache=compile_cache,""",
        new="""            self._decide(candidate, options, kept=False, reason=self._failure_reason(verdict),""",
        tests=("tests/test_auto.py::test_a_numerics_failure_is_not_paid_for_again_in_another_mode_and_its_compile_is_reported",),
    ),
    Mutation(
        name="the callback's own retry in another mode counted as the model's recompile",
        path="compile_callback/watch.py",
        old="            elif record.recompile_reason and record.is_forward and BACKEND_MATCH in record.recompile_reason:\n",
        new="            elif False:\n",
        tests=("tests/test_watch.py::test_a_recompile_for_another_backend_is_the_callbacks_retry_not_the_models_churn",),
    ),
    Mutation(
        name="a CUDA-graph plan's memory read without its pool",
        path="compile_callback/memory.py",
        old="    high = graph_step_high if cuda_graphs else allocated_high\n",
        new="    high = allocated_high\n",
        tests=("tests/test_memory.py",),
    ),
    Mutation(
        name="a child compiles in float32 where the training forward's default dtype is bf16",
        path="compile_callback/background.py",
        old="            torch.set_default_dtype(default_dtype)\n",
        new="",
        tests=("tests/test_background.py::test_the_childs_verification_stands_where_the_trial_compiled_from_its_cache",),
    ),
    Mutation(
        name="a background child's CPUs from the environment not applied",
        path="compile_callback/background.py",
        old="            os.sched_setaffinity(process.pid, cpus)\n",
        new="            pass\n",
        tests=("tests/test_background.py::test_the_cpus_a_child_may_use_can_be_set_from_the_environment_and_a_bad_list_is_named",),
    ),
    Mutation(
        name="a child's stages not written as they start",
        path="compile_callback/verify.py",
        old="    if stage_started is not None:\n        stage_started(stage)\n",
        new="",
        tests=("tests/test_background.py::test_a_report_made_while_the_child_compiles_says_which_stages_it_has_started",),
    ),
    Mutation(
        name="a report made while a child compiles says nothing of it",
        path="compile_callback/planner.py",
        old="        if self.compiling_in_background is None:\n            return None\n        name, batch, child",
        new="        if True:\n            return None\n        name, batch, child",
        tests=("tests/test_background.py::test_a_report_made_while_the_child_compiles_says_which_stages_it_has_started",),
    ),
    Mutation(
        name="a paired run's child stages set against the wrong steps (each step's start, not its end)",
        path="benchmarks/table.py",
        old="if at <= begun + ends[i] < until]",
        new="if at <= begun + (ends[i - 1] if i else 0.0) < until]",
        tests=("tests/benchmarks/test_checks.py::test_a_paired_run_shows_what_the_callbacks_child_was_doing_where_it_cost_time",),
    ),
    Mutation(
        name="the step meter's step ends on the wrong clock origin",
        path="benchmarks/measure.py",
        old="        self._begun_at = time.time()\n",
        new="        self._begun_at = time.time() - 60.0\n",
        tests=("tests/benchmarks/test_smoke.py",),
    ),
    Mutation(
        name="a child lowers its priority only once its payload comes (a standby's imports at the run's)",
        path="compile_callback/boot.py",
        old="    lower(int(os.environ.pop(LOWER_BY_VARIABLE, None) or 0))",
        new="    os.environ.pop(LOWER_BY_VARIABLE, None)",
        tests=("tests/test_background.py::test_a_standby_runs_below_the_runs_priority_from_its_start_not_only_once_its_payload_comes",
               "tests/test_background.py::test_a_candidate_compiles_in_a_child_while_training_goes_on_eagerly"),
    ),
]


def source_files() -> list[str]:
    """The working tree as git sees it: tracked files and untracked ones it does not ignore."""
    listed = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"],
        cwd=ROOT, check=True, capture_output=True, text=True,
    ).stdout
    return [path for path in listed.split("\0") if path and os.path.isfile(os.path.join(ROOT, path))]


def make_copy(files: list[str]) -> str:
    copy = tempfile.mkdtemp(prefix="mutant-")
    for path in files:
        target = os.path.join(copy, path)
        os.makedirs(os.path.dirname(target), exist_ok=True)
        shutil.copy2(os.path.join(ROOT, path), target)
    return copy


def check_pattern(copy: str, mutation: Mutation) -> str:
    """The file's text, if the mutation's old text occurs in it exactly once; else exits, saying so."""
    with open(os.path.join(copy, mutation.path)) as handle:
        text = handle.read()
    count = text.count(mutation.old)
    if count != 1:
        raise SystemExit(
            f"mutation {mutation.name!r}: its old text occurs {count} times in {mutation.path} (expected once). "
            f"The code moved on: rewrite the mutation in tests/mutations.py.\n--- old text ---\n{mutation.old}"
        )
    return text


def apply(copy: str, mutation: Mutation) -> None:
    text = check_pattern(copy, mutation)
    with open(os.path.join(copy, mutation.path), "w") as handle:
        handle.write(text.replace(mutation.old, mutation.new))


def environment(copy: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = copy + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


def check_imports_the_copy(copy: str) -> None:
    """The venv has the package installed in editable mode (pointing at the real tree): make sure the
    copy, not the original, is what the tests import."""
    found = subprocess.run(
        [sys.executable, "-c", "import compile_callback, tests.conftest; print(compile_callback.__file__); "
                               "print(tests.conftest.__file__)"],
        cwd=copy, env=environment(copy), check=True, capture_output=True, text=True,
    ).stdout.split()
    outside = [path for path in found if not os.path.realpath(path).startswith(os.path.realpath(copy))]
    if outside:
        raise SystemExit(f"the copy at {copy} imports {outside} from outside itself; the mutations would not be seen.")


def run_tests(copy: str, tests: tuple[str, ...], timeout: int) -> tuple[bool, float, str]:
    """Whether the tests passed, how long they took, and the tail of pytest's output."""
    start = time.monotonic()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "pytest", "-q", "-x", "-p", "no:cacheprovider", *tests],
            cwd=copy, env=environment(copy), capture_output=True, text=True, timeout=timeout,
        )
        passed, output = result.returncode == 0, result.stdout + result.stderr
        if result.returncode not in (0, 1):  # 2: interrupted, 4: usage error, 5: no tests collected
            raise SystemExit(f"pytest exited with {result.returncode} on {tests}:\n{output[-3000:]}")
    except subprocess.TimeoutExpired:
        passed, output = False, f"timed out after {timeout} s"
    return passed, time.monotonic() - start, output


def first_failure(output: str) -> str:
    """The failing test and pytest's first ``E`` line: what caught the mutation."""
    failed = next((line.split(" ", 1)[1].split(" - ")[0] for line in output.splitlines() if line.startswith("FAILED ")), "")
    error = " ".join([line[1:].strip() for line in output.splitlines() if line.startswith("E ")][:2])
    return f"{failed.rsplit('::', 1)[-1]}: {error}"[:200] if failed else output.strip().splitlines()[-1][:200]


def main(argv: list[str]) -> int:
    selected = [m for m in MUTATIONS if not argv or any(word in m.name for word in argv)]
    if not selected:
        print(f"no mutation's name contains any of {argv}; names: {[m.name for m in MUTATIONS]}")
        return 2
    from compile_callback.background import CHILD_NICENESS

    niceness = os.nice(0)
    if niceness + CHILD_NICENESS > 19:  # a child cannot then run below the tests' priority: those mutations pass
        print(f"run the mutations at a niceness of at most {19 - CHILD_NICENESS} (this process: {niceness}): a background "
              f"child runs {CHILD_NICENESS} below its run, which needs room up to 19, or the tests cannot tell a child that "
              "does not lower its priority from one that does")
        return 2
    files = source_files()
    timeout = int(os.environ.get("MUTATE_TIMEOUT_S", "1200"))
    baseline = make_copy(files)
    rows: list[tuple[str, str, float]] = []
    try:
        check_imports_the_copy(baseline)
        for mutation in selected:  # every pattern is checked before anything runs
            check_pattern(baseline, mutation)
        tests = tuple(dict.fromkeys(t for m in selected for t in m.tests))
        passed, seconds, tail = run_tests(baseline, tests, timeout)
        print(f"baseline (no mutation): {'passed' if passed else 'FAILED'} in {seconds:.0f} s", flush=True)
        if not passed:
            print("\n".join(tail.strip().splitlines()[-30:]))
            print("the tests fail without any mutation, so a mutation's failures would prove nothing")
            return 1
        for mutation in selected:
            copy = make_copy(files)
            try:
                apply(copy, mutation)
                passed, seconds, tail = run_tests(copy, mutation.tests, timeout)
            finally:
                shutil.rmtree(copy, ignore_errors=True)
            rows.append((mutation.name, "NOT caught" if passed else "caught", seconds))
            print(f"  {mutation.name}: {rows[-1][1]} ({seconds:.0f} s)", flush=True)
            if not passed:
                print(f"    by {first_failure(tail)}", flush=True)
    finally:
        shutil.rmtree(baseline, ignore_errors=True)
    width = max(len(name) for name, _, _ in rows)
    print()
    print(f"| {'mutation':<{width}} | result     | seconds |")
    print(f"|{'-' * (width + 2)}|------------|---------|")
    for name, result, seconds in rows:
        print(f"| {name:<{width}} | {result:<10} | {seconds:>7.0f} |")
    missed = [name for name, result, _ in rows if result != "caught"]
    if missed:
        print(f"\n{len(missed)} mutation(s) NOT caught: {missed}")
        return 1
    print(f"\nevery mutation caught ({len(rows)})")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
