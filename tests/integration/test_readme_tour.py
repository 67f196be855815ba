"""The README's tour is a test: its shell blocks run, in order, against a fresh ``agap up``.

What `make run` does, in a directory that looks like a checkout (the repository's cards,
souls, docs and example files linked in): ``agap up`` on the embedded board, offline, on
the demo model. Then every ```sh block of the README's ``## A tour`` section runs in bash
under ``set -euo pipefail`` with a time limit, in a shell whose environment has no fabric
settings and no ``agap`` on PATH: the tour's first block (the lines ``agap up`` printed)
has to provide them. Variables and the working directory carry over from block to block,
as in one interactive shell. A line ending in ``# exit N`` must exit with N.

So the README and the fabric cannot drift apart: a tour line that stops working fails here.
"""

from __future__ import annotations

import contextlib
import os
import queue
import re
import shutil
import signal
import subprocess
import sys
import threading
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests.conftest import ROOT
from tests.helpers import wait_until

README = ROOT / "README.md"
SECTION = "## A tour"
# The tours, run in this order in one shell: the README's, then docs/TOUR.md's.
TOURS = ((README, "## A tour"), (ROOT / "docs" / "TOUR.md", "## The longer tour"))
BANNER_MARK = "<!-- tour: printed by make run -->"
BLOCK_TIMEOUT = 240.0  # seconds per block; a loaded 2-CPU machine starts 9 Pythons slowly
# What a checkout has that the tour uses (`cards` and `souls` for the workers, the example
# schedule file for `agap cron`).
CHECKOUT = ("cards", "souls", "docs", "schedules.example.yaml", "README.md")
EXIT_NOTE = re.compile(r"\s#\s*exit\s+(\d+)(?::|\s*$)")  # "# exit 4" or "# exit 4: why"


@dataclass(frozen=True)
class Block:
    """One ```sh block of a tour."""

    line_no: int  # of its first line in its file
    lines: tuple[str, ...]
    printed_by_make_run: bool = False
    file: str = "README.md"

    def where(self) -> str:
        return f"{self.file}:{self.line_no}"


def all_blocks() -> list[Block]:
    """Every tour's blocks, in the order they run."""
    out: list[Block] = []
    for path, section in TOURS:
        name = str(path.relative_to(ROOT))
        out += [
            Block(b.line_no, b.lines, b.printed_by_make_run, name)
            for b in tour_blocks(path.read_text(), section)
        ]
    return out


def tour_blocks(text: str, section: str = SECTION) -> list[Block]:
    """The ```sh blocks of a tour's section, in order (any other fence is an error)."""
    lines = text.splitlines()
    start = lines.index(section)
    end = next((i for i in range(start + 1, len(lines)) if lines[i].startswith("## ")), len(lines))
    blocks: list[Block] = []
    i = start + 1
    while i < end:
        line = lines[i]
        if line.startswith("```"):
            assert line == "```sh", f"README.md:{i + 1}: a tour block must be ```sh (it is run): {line!r}"
            close = lines.index("```", i + 1)
            assert close < end, f"README.md:{i + 1}: unclosed block"
            before = next((lines[j] for j in range(i - 1, start, -1) if lines[j].strip()), "")
            blocks.append(Block(i + 2, tuple(lines[i + 1 : close]), before.strip() == BANNER_MARK))
            i = close
        i += 1
    return blocks


def expected_exit(line: str) -> int | None:
    """N for a line annotated ``# exit N`` (the tour shows a refusal), else None."""
    m = EXIT_NOTE.search(line)
    return int(m.group(1)) if m else None


def block_script(block: Block, lines: tuple[str, ...], state: Path) -> str:
    """The bash script that runs ``lines``: the state of the blocks before it, then each line,
    then its own state for the next block (exported variables and the directory)."""
    out = [
        "set -euo pipefail",
        "set -a",  # assignments are exported, so the next block (another bash) sees them
        f"if [ -f {state} ]; then . {state}; fi",
    ]
    for n, line in enumerate(lines):
        code = expected_exit(line)
        if code is None:
            out.append(line)
            continue
        where = f"{block.where().split(':')[0]}:{block.line_no + n}"
        out += [
            "set +e",
            line,
            "rc=$?",
            "set -e",
            f'if [ "$rc" -ne {code} ]; then echo "tour: {where}: exit $rc, the README says {code}" >&2; '
            "exit 97; fi",
        ]
    out += [
        f"export -p | grep -Ev '^declare -[a-zA-Z]*r|^declare -x (PWD|OLDPWD|SHLVL|_)=' > {state}.new",
        f'printf "cd %q\\n" "$PWD" >> {state}.new',
        f"mv {state}.new {state}",
    ]
    return "\n".join(out) + "\n"


def settings_names(lines: tuple[str, ...] | list[str]) -> list[str]:
    """What each setup line sets: ``cd`` or the exported variable's name."""
    out = []
    for line in lines:
        m = re.match(r"^\s*(cd)\s|^\s*export\s+([A-Za-z_][A-Za-z0-9_]*)=", line)
        assert m, f"not a cd or export line: {line!r}"
        out.append(m.group(1) or m.group(2))
    return out


class Up:
    """``agap up`` in ``cwd``, as `make run` starts it; its banner's setup lines."""

    def __init__(self, cwd: Path, env: dict[str, str]) -> None:
        self.log = cwd / "up.log"
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "fabric.apps.cli", "up"],
            cwd=cwd,
            env=env,
            stdout=subprocess.PIPE,
            stderr=self.log.open("w"),
            text=True,
        )
        self.lines: queue.Queue[str] = queue.Queue()
        threading.Thread(target=self._read, daemon=True).start()

    def _read(self) -> None:
        assert self.proc.stdout is not None
        for line in self.proc.stdout:
            self.lines.put(line.rstrip("\n"))

    def banner(self, timeout: float = 120.0) -> list[str]:
        seen: list[str] = []

        def done() -> bool:
            while not self.lines.empty():
                seen.append(self.lines.get())
            assert self.proc.poll() is None, f"agap up exited: {self.tail()}"
            return any("Ctrl-C stops everything" in x for x in seen)

        wait_until(done, timeout=timeout, what="the banner of agap up")
        return seen

    def tail(self) -> str:
        return "\n".join(self.log.read_text().splitlines()[-30:])

    def stop(self) -> int:
        self.proc.send_signal(signal.SIGINT)
        try:
            return self.proc.wait(60)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()


def setup_lines(banner: list[str]) -> list[str]:
    """The lines the banner tells a second shell to paste (cd and exports)."""
    return [x.strip() for x in banner if re.match(r"^\s+(cd|export)\s", x)]


def fresh_user_env(tmp_path: Path) -> dict[str, str]:
    """A newcomer's shell: no fabric settings and no venv on PATH; git knows who commits."""
    venv_bin = str(Path(sys.executable).parent)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AGAP_", "KANBOARD_", "LITELLM_"))}
    env.pop("VIRTUAL_ENV", None)
    env["PATH"] = os.pathsep.join(p for p in env.get("PATH", "").split(os.pathsep) if p != venv_bin)
    env["XDG_CACHE_HOME"] = str(tmp_path / "cache")  # not the developer's layout cache
    for who in ("AUTHOR", "COMMITTER"):
        env[f"GIT_{who}_NAME"] = "Tour"
        env[f"GIT_{who}_EMAIL"] = "tour@example.invalid"
    env["GIT_CONFIG_GLOBAL"] = str(tmp_path / "gitconfig")
    env["GIT_CONFIG_NOSYSTEM"] = "1"
    return env


def run_block(script: str, cwd: Path, env: dict[str, str], where: str) -> subprocess.CompletedProcess[str]:
    """Run one block's script in bash, in its own process group (a background server it
    starts is stopped with it), within ``BLOCK_TIMEOUT``."""
    proc = subprocess.Popen(
        ["bash", "-c", script],
        cwd=cwd,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(timeout=BLOCK_TIMEOUT)
    except subprocess.TimeoutExpired:
        os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        pytest.fail(f"{where}: the block did not end within {BLOCK_TIMEOUT:.0f}s\n{out}\n{err}")
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)  # anything it left running in the background
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def test_the_tour_is_found_and_annotated() -> None:
    """The extraction itself: the section has blocks, the first is make run's, refusals parse."""
    blocks = all_blocks()
    assert len(blocks) >= 5 and blocks[0].printed_by_make_run
    assert [b.printed_by_make_run for b in blocks[1:]] == [False] * (len(blocks) - 1)
    assert settings_names(blocks[0].lines)[:2] == ["cd", "PATH"], "the tour says how to put agap on PATH"
    codes = [expected_exit(x) for b in blocks for x in b.lines]
    assert 4 in codes and 5 in codes, "the tour shows refusals with their exit codes"
    assert expected_exit('agap watch "$id"   # events; exit 0 done, 1 failed') is None
    assert expected_exit("agap claim --json   # exit 4: nothing to claim") == 4
    assert expected_exit("agap claim --json   # exit 4") == 4
    assert expected_exit("agap claim --json   # exit 4 when there is none") is None


def test_every_line_of_the_readme_tour_runs(tmp_path: Path) -> None:
    for tool in ("bash", "jq", "git", "curl"):
        assert shutil.which(tool), f"the tour needs {tool} (README, A tour)"
    blocks = all_blocks()
    checkout = tmp_path / "checkout"
    checkout.mkdir()
    for name in CHECKOUT:
        (checkout / name).symlink_to(ROOT / name)
    up_env = {
        **os.environ,
        "AGAP_BOARD_PORT": "0",  # any free port: the banner says which
        "XDG_CACHE_HOME": str(tmp_path / "cache"),
        "AGAP_POLL_SECONDS": "0.5",
    }
    for name in ("AGAP_MODEL_MODE", "AGAP_STATE_DIR", "AGAP_CARDS_DIR", "AGAP_ENV_FILE", "AGAP_REF_ROOTS"):
        up_env.pop(name, None)  # as make run: the demo model, ./var, ./cards, refs under .
    up = Up(checkout, up_env)
    try:
        printed = setup_lines(up.banner())
        assert settings_names(printed) == settings_names(blocks[0].lines), (
            "the tour's first block must set what agap up prints",
            printed,
            blocks[0].lines,
        )
        env = fresh_user_env(tmp_path)
        state = tmp_path / "tour-state.sh"
        for block in blocks:
            lines = tuple(printed) if block.printed_by_make_run else block.lines
            res = run_block(block_script(block, lines, state), tmp_path, env, block.where())
            assert res.returncode == 0, (
                f"{block.where()}: the block exited {res.returncode}\n"
                f"--- stdout\n{res.stdout[-3000:]}\n--- stderr\n{res.stderr[-3000:]}\n"
                f"--- agap up\n{up.tail()}"
            )
            assert up.proc.poll() is None, f"agap up died during {block.where()}: {up.tail()}"
    finally:
        code = up.stop()
    assert code == 0, up.tail()
