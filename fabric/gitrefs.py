"""The ``git+`` ref, read in one place: ``git+<clone URL>#<fragment>``.

Two things read such refs, and both split them here:

* a coding task names its repository and branch (``git+https://host/o/r.git#main``, a
  checkpoint ``#branch@<commit>``): :class:`fabric.apps.workspace.RepoRef`;
* a task's context may name one file of a local repository at a revision
  (``git+file:///srv/git/notes.git#main:week.md``, the fragment as ``git show`` writes
  it): :mod:`workers.gitref`.

A fragment with a ``:`` names a blob (``<rev>:<path>``); one without names a branch.
"""

from __future__ import annotations

from urllib.parse import unquote, urlsplit

from fabric.plain import Plain

PREFIX = "git+"


class GitRef(Plain):
    """A ``git+`` ref split into what git clones and what the fragment says."""

    url: str  # the clone URL (file:///…, https://…, ssh://…)
    fragment: str  # after '#', as written ("" when there is none)

    @property
    def scheme(self) -> str:
        return urlsplit(self.url).scheme

    @property
    def host(self) -> str:
        return urlsplit(self.url).netloc

    @property
    def path(self) -> str:
        """The repository's path in the URL, percent-decoded."""
        return unquote(urlsplit(self.url).path)

    @property
    def blob(self) -> tuple[str, str] | None:
        """``(rev, path)`` when the fragment names a file (``<rev>:<path>``), else None."""
        rev, colon, path = unquote(self.fragment).partition(":")
        return (rev, path) if colon else None


def is_git_ref(text: str) -> bool:
    return text.startswith(PREFIX)


def split_git_ref(text: str) -> GitRef:
    """``text`` as a :class:`GitRef`; :class:`ValueError` when it is not a ``git+`` ref."""
    text = text.strip()
    if not is_git_ref(text):
        raise ValueError(f"{text!r} is not a git ref")
    url, _, fragment = text[len(PREFIX) :].partition("#")
    return GitRef(url, fragment)


__all__ = ["PREFIX", "GitRef", "is_git_ref", "split_git_ref"]
