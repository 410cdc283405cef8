"""Speed claims for compile-callback, measured side by side in one process (see BENCHMARKING.md).

``python -m benchmarks --workload {gpt2,resnet50,resnet18_cifar,gpt2_varlen,hf_gpt2,hf_gpt2_direct,timm_vit,hf_bert_mlm}`` runs the
variants of a workload (a plain PyTorch loop, Lightning eager, whole-model compile in default and
``reduce-overhead`` mode, per-block compile, ``CompileCallback()``) on the same data and weights and writes
JSON plus a Markdown table; ``python -m benchmarks.table`` turns those JSON files into BENCHMARKS.md.

Modules: ``workloads`` (models and data), ``variants`` (how each variant compiles), ``runner`` (the
loops), ``measure`` (timing), ``checks`` (the callback's telemetry error, best anchor and memory against
the harness's own numbers), ``dynamo_counts`` (dynamo's private counters), ``table`` (Markdown).
"""
