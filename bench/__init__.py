"""Benchmarks for the fabric (never part of the tests): ``make bench`` or ``python -m bench``.

Figures are round-trip counts, and throughput as a ratio of the board's own ceiling
(raw ``createTask``) measured in the same run. Results land in ``bench/results/``.

Boards measured, each its own column of the tables:

* the embedded board, always, in its default flavour (``strict``: the rules of every
  Kanboard backend at once); ``AGAP_BENCH_EMBEDDED_FLAVOUR=sqlite|postgres|mysql|strict``
  picks another;
* any number of real Kanboards in ``AGAP_BENCH_KANBOARDS`` (the only way to name one: the
  fabric's own ``KANBOARD_URL`` is never benchmarked): comma-separated entries
  ``<flavour>=<url>|<token>``, for example::

    AGAP_BENCH_KANBOARDS="sqlite=http://127.0.0.1:8081/jsonrpc.php|tok1,
                          postgres=http://127.0.0.1:8082/jsonrpc.php|tok2,
                          mysql=http://127.0.0.1:8083/jsonrpc.php|tok3"

  Whitespace and newlines around entries are ignored; ``postgresql``/``pg`` and ``mariadb`` are accepted for
  ``postgres`` and ``mysql``. A URL named twice is measured once. The columns read
  "real Kanboard (SQLite)", "real Kanboard (PostgreSQL)", "real Kanboard
  (MySQL/MariaDB)" (a second board of the same backend gets "#2").

Real Kanboards must be on loopback (``AGAP_BENCH_ALLOW_REMOTE=1`` lifts that: the run
creates and removes dozens of projects and loads the board hard). Each must answer
``getVersion`` before anything is measured; one that fails mid-run is reported as
failed and the others still are measured. ``--embedded-only`` ignores all of them.

Sizes (defaults of ``make bench``; ``--quick`` has smaller ones), each overridden by
``AGAP_BENCH_<NAME>`` and bounded:

* ``AGAP_BENCH_PROCS`` (1,2,4,8): process counts of the throughput/race section;
* ``AGAP_BENCH_EMBEDDED_TASKS`` (100): tasks per point on the embedded board;
* ``AGAP_BENCH_REAL_TASKS`` (30): tasks per point on each real Kanboard;
* ``AGAP_BENCH_REPEATS`` (2): runs per point (the best rate is kept, counts are summed);
* ``AGAP_BENCH_RAW_SECONDS`` (1.5): seconds of raw ``createTask`` per point;
* ``AGAP_BENCH_TRIP_SAMPLES`` (10): samples per round-trip count;
* ``AGAP_BENCH_CLI_RUNS`` (3): warm ``agap submit`` runs;
* ``AGAP_BENCH_DEADLINE`` (40): seconds a point's processes may run at most;
* ``AGAP_BENCH_SETTLE`` (1.0): seconds after a point's end before the second audit
  (0: audit only at the end).

The throughput/race section reports, per board and process count, for the fabric and
the naive claimer: double executions, tasks not done, and cards in a column that
disagrees with the task's state (see :mod:`bench.throughput`).
"""
