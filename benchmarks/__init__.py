"""The benchmark scripts, each run from the repository root (``python benchmarks/run.py ...``).

Tests do not import this package and it imports no tests: what both need (model builders, the
node suite's cases, the fuzz graphs, the decisions snapshot, the kernel-table check) is in
``models/`` (``tests/test_layers.py`` checks it).
"""
