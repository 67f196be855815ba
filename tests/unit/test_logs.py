"""The daemons' log levels: quiet under ``agap up``, APScheduler's job lines only with -v."""

from __future__ import annotations

import logging
import subprocess
import sys
from collections.abc import Iterator

import pytest

from fabric.apps.cli import logs


@pytest.fixture
def restore_logging() -> Iterator[None]:
    root = logging.getLogger()
    saved = (root.level, list(root.handlers))
    chatty = {n: logging.getLogger(n).level for n in logs.CHATTY}
    yield
    root.setLevel(saved[0])
    root.handlers[:] = saved[1]
    for name, level in chatty.items():
        logging.getLogger(name).setLevel(level)


@pytest.mark.usefixtures("restore_logging")
def test_levels() -> None:
    assert logs.configure(quiet=True) == logging.WARNING
    assert logging.getLogger("apscheduler.executors.default").getEffectiveLevel() == logging.WARNING
    assert logs.configure() == logging.INFO
    # The scheduler's per-job INFO lines stay out even at the default level.
    assert not logging.getLogger("apscheduler.scheduler").isEnabledFor(logging.INFO)
    assert logs.configure(verbose=True) == logging.DEBUG
    assert logging.getLogger("apscheduler.scheduler").isEnabledFor(logging.DEBUG)


def test_agap_up_children_are_quiet_by_default() -> None:
    assert logs.child_flags(0) == ["-q"]
    assert logs.child_flags(1) == []
    assert logs.child_flags(2) == ["-v"]


def test_keeper_job_lines_are_not_logged_at_the_default_level() -> None:
    """A real APScheduler run at the default level writes no "Running job" lines."""
    code = (
        "import threading\n"
        "from fabric.apps.cli import logs\n"
        "from apscheduler.schedulers.background import BackgroundScheduler\n"
        "logs.configure()\n"
        "s = BackgroundScheduler(); s.start()\n"
        "done = threading.Event()\n"
        "s.add_job(done.set)\n"
        "ran = done.wait(30)\n"
        "s.shutdown(wait=True)  # the job's own log lines are written before this returns\n"
        "print('ran', int(ran))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    assert "ran 1" in out.stdout
    assert "Running job" not in out.stderr and "executed successfully" not in out.stderr
