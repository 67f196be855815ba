"""Container healthchecks for the fabric image: ``python -m fabric.apps.deploy.health CHECK``.

* ``process`` — the container's main process (PID 1) is alive and not a zombie. Workers
  use it: a worker whose board or model plane is away parks and retries, which is healthy;
  restarting it would not help.
* ``http URL [--bearer-env VAR]`` — the URL answers 2xx (with ``Authorization: Bearer``
  taken from the variable ``VAR``, never from the command line).
* ``tcp HOST PORT`` — something listens there.

Exit 0 when healthy, 1 otherwise (one line on stderr says why). Standard library only (and
the settings registry, which is too): a healthcheck must not pay for the fabric's imports.
"""

from __future__ import annotations

import socket
import sys
import urllib.error
import urllib.request
from collections.abc import Sequence
from pathlib import Path

from fabric.settings import registry


def check_process(pid: int = 1, proc: Path = Path("/proc")) -> str | None:
    """None when ``pid`` runs; else why not."""
    try:
        status = (proc / str(pid) / "status").read_text()
    except OSError:
        return f"process {pid} is gone"
    for line in status.splitlines():
        if line.startswith("State:") and line.split()[1:2] in (["Z"], ["X"]):
            return f"process {pid} is a zombie"
    return None


def check_http(url: str, bearer_env: str | None = None, timeout: float = 4.0) -> str | None:
    """None when ``url`` answers 2xx."""
    request = urllib.request.Request(url, headers={"User-Agent": "agap-healthcheck"})
    if bearer_env:
        token = registry.named(bearer_env)
        if not token:
            return f"{bearer_env} is not set"
        request.add_header("Authorization", f"Bearer {token}")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as resp:
            code = int(resp.status)
    except urllib.error.HTTPError as exc:
        code = exc.code
    except (OSError, ValueError) as exc:
        return f"{url}: {exc}"
    return None if 200 <= code < 300 else f"{url}: HTTP {code}"


def check_tcp(host: str, port: int, timeout: float = 3.0) -> str | None:
    """None when ``host:port`` accepts a connection."""
    try:
        with socket.create_connection((host, port), timeout=timeout):
            return None
    except OSError as exc:
        return f"{host}:{port}: {exc}"


def main(argv: Sequence[str] | None = None) -> int:
    args = list(sys.argv[1:] if argv is None else argv)
    problem: str | None
    if args[:1] == ["process"]:
        problem = check_process()
    elif args[:1] == ["http"] and len(args) in (2, 4) and (len(args) == 2 or args[2] == "--bearer-env"):
        problem = check_http(args[1], args[3] if len(args) == 4 else None)
    elif args[:1] == ["tcp"] and len(args) == 3 and args[2].isdigit():
        problem = check_tcp(args[1], int(args[2]))
    else:
        print(
            "usage: python -m fabric.apps.deploy.health process | http URL [--bearer-env VAR] "
            "| tcp HOST PORT",
            file=sys.stderr,
        )
        return 2
    if problem:
        print(f"unhealthy: {problem}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
