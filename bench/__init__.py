"""Benchmarks for the fabric (never part of the tests): ``make bench`` or ``python -m bench``.

Figures are round-trip counts, and throughput as a ratio of the board's own ceiling
(raw ``createTask``) measured in the same run. Results land in ``bench/results/``.
"""
