"""Off-protocol diagnostics: scripts that answer one question on the GPU machine, kept beside the
harness (not among the results they produced). Each module's docstring says what it measures and how
to run it: ``phases`` (per-batch peak memory by planner phase, process state and host probes between
variants, cProfile of a variant), ``revert`` (a reverted
region's speed), ``ddp_check`` (DDP loss curves and parameter checksums per rank)."""
