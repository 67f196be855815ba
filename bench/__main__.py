"""``python -m bench``: run every benchmark and write ``bench/results/``."""

from __future__ import annotations

import sys

from bench.run import main

if __name__ == "__main__":
    sys.exit(main())
