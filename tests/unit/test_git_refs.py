"""``git+file:///repo#<rev>:<path>`` refs: real git repositories in a temporary directory,
read only under the roots, bounded, with nothing the ref says reaching git as an option."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

from workers.gitref import GitFileReader, parse_git_ref
from workers.refs import RefResolver, UnresolvableRef


def git(cwd: Path, *args: str) -> str:
    env = {**os.environ, "GIT_CONFIG_GLOBAL": os.devnull, "GIT_CONFIG_NOSYSTEM": "1"}
    ident = ["-c", "user.name=t", "-c", "user.email=t@example.invalid"]
    return subprocess.run(
        ["git", *ident, *args], cwd=cwd, env=env, check=True, capture_output=True, text=True
    ).stdout


def make_repo(path: Path, files: dict[str, bytes]) -> Path:
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    for name, data in files.items():
        (path / name).parent.mkdir(parents=True, exist_ok=True)
        (path / name).write_bytes(data)
    git(path, "add", "-A")
    git(path, "commit", "-q", "-m", "one")
    return path


@pytest.fixture
def root(tmp_path: Path) -> Path:
    r = tmp_path / "root"
    make_repo(
        r / "notes", {"week.md": b"Mon: dentist\n", "docs/plan.md": b"the plan\n", "bin.dat": b"\x00\x01"}
    )
    return r


def refs(root: Path, max_bytes: int = 64 * 1024) -> RefResolver:
    return RefResolver(
        roots=[root], schemes={"git+file": GitFileReader()}, max_bytes=max_bytes, http_timeout=10
    )


def test_a_file_at_a_revision(root: Path) -> None:
    repo = root / "notes"
    assert refs(root).resolve(f"git+file://{repo}#main:week.md") == "Mon: dentist\n"
    (repo / "week.md").write_text("Tue: changed\n")
    git(repo, "commit", "-qam", "two")
    assert refs(root).resolve(f"git+file://{repo}#main:week.md") == "Tue: changed\n"
    assert refs(root).resolve(f"git+file://{repo}#main~1:week.md") == "Mon: dentist\n"
    assert refs(root).resolve(f"git+file://{repo}#main:docs%2Fplan.md") == "the plan\n"  # decoded once


def test_a_bare_repository_and_a_commit_id(root: Path) -> None:
    bare = root / "notes.git"
    subprocess.run(["git", "clone", "-q", "--bare", str(root / "notes"), str(bare)], check=True)
    sha = git(root / "notes", "rev-parse", "HEAD").strip()
    assert refs(root).resolve(f"git+file://{bare}#{sha[:10]}:week.md") == "Mon: dentist\n"


def test_a_repository_ref_puts_nothing_into_the_prompt(root: Path) -> None:
    assert refs(root).resolve(f"git+file://{root}/notes#main") is None
    assert refs(root).resolve_all([f"git+file://{root}/notes"]) == {}


def test_the_text_is_capped(root: Path, tmp_path: Path) -> None:
    make_repo(root / "big", {"big.md": b"x" * 100_000})
    text = refs(root, max_bytes=1000).resolve(f"git+file://{root}/big#main:big.md")
    assert text is not None and text.startswith("x" * 1000) and "99000 more bytes" in text


@pytest.mark.parametrize(
    ("fragment", "why"),
    [
        ("--output=/tmp/x:week.md", "not a revision"),
        ("-p:week.md", "not a revision"),
        ("main..HEAD:week.md", "not a revision"),
        ("HEAD@{1}:week.md", "not a revision"),
        ("main:../outside.md", "not a path inside"),
        ("main:docs/../../x", "not a path inside"),
        ("main:/etc/passwd", "not a path inside"),
        ("main:", "not a path inside"),
        ("main:nope.md", "no nope.md at main"),
        ("main:docs", "is a tree, not a file"),
        ("main:bin.dat", "binary"),
        ("nosuchbranch:week.md", "no week.md at nosuchbranch"),
    ],
)
def test_bad_revisions_and_paths_are_refused(root: Path, fragment: str, why: str) -> None:
    with pytest.raises(UnresolvableRef, match=why):
        refs(root).resolve(f"git+file://{root}/notes#{fragment}")


def test_only_repositories_under_the_roots(root: Path, tmp_path: Path) -> None:
    make_repo(tmp_path / "elsewhere", {"a.md": b"secret\n"})
    with pytest.raises(UnresolvableRef, match="outside the directories"):
        refs(root).resolve(f"git+file://{tmp_path}/elsewhere#main:a.md")
    (root / "link").symlink_to(tmp_path / "elsewhere")  # a link inside the roots does not help
    with pytest.raises(UnresolvableRef, match="outside the directories"):
        refs(root).resolve(f"git+file://{root}/link#main:a.md")
    with pytest.raises(UnresolvableRef, match="outside the directories"):
        refs(root).resolve(f"git+file://{root}/notes/..%2F..%2Felsewhere#main:a.md")


def test_objects_from_elsewhere_are_not_read(root: Path, tmp_path: Path) -> None:
    other = make_repo(tmp_path / "private", {"diary.md": b"private\n"})
    gitfile = root / "worktree"
    gitfile.mkdir()
    (gitfile / ".git").write_text(f"gitdir: {other}/.git\n")
    with pytest.raises(UnresolvableRef, match="not followed"):
        refs(root).resolve(f"git+file://{gitfile}#main:diary.md")
    borrowed = root / "borrowed"
    subprocess.run(["git", "clone", "-q", "--shared", str(other), str(borrowed)], check=True)
    with pytest.raises(UnresolvableRef, match="alternates"):
        refs(root).resolve(f"git+file://{borrowed}#main:diary.md")


def test_another_host_is_refused() -> None:
    with pytest.raises(UnresolvableRef, match="another host"):
        parse_git_ref("git+file://example.org/srv/repo#main:a.md")
    with pytest.raises(UnresolvableRef, match="absolute"):
        parse_git_ref("git+file:relative/repo#main:a.md")
