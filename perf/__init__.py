"""plexgt's benchmarks, a package run from the checkout's root: ``python -m perf.bench_x``.

What they share is :mod:`perf.harness` (results, datasets, prepared graphs, launches, the
hardware, the RESULT line); the planner's score, which bench_agp and validate_plan both give,
is :mod:`perf.plan_score`. Each benchmark writes ``perf/results/<name>.json`` and ends with
one ``RESULT`` line; perf/results/README.md indexes them.
"""
