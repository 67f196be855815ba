"""Refs in canonical form, and the read-time guard on the object actually opened."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from fabric.cards import CardSet
from fabric.domains import Domains, ReadGuard
from fabric.policy_file import PolicyConfig
from fabric.refcanon import BadRef, canonical, canonical_prefix, under
from fabric.refusals import PrivacyViolation
from workers.refs import RefResolver


@pytest.mark.parametrize(
    "ref,key",
    [
        ("task:12", "task:12"),
        ("task:#12", "task:12"),
        ("kanboard://task/12/file/result-e1.md", "task:12"),
        ("kanboard://TASK/12/", "task:12"),
        ("task:%31%32", "task:12"),
        ("file:///a/./b//c/../d.md", "file:///a/b/d.md"),
        ("file://LOCALHOST/a/%62/d.md", "file:///a/b/d.md"),
        ("file:///a%2Fb%2Fd.md", "file:///a/b/d.md"),
        ("file:///a/b/d.md#page=2", "file:///a/b/d.md"),
        ("git+file:///a/b.git#main", "file:///a/b.git"),
        ("Hindsight://Bank-%41//x/../y", "hindsight://Bank-A/y"),  # a bank id keeps its case
    ],
)
def test_one_canonical_form_per_object(ref: str, key: str) -> None:
    assert canonical(ref).key == key


@pytest.mark.parametrize(
    "ref,why",
    [
        ("file:///a#domain=shared", "label"),
        ("task:5#domain=shared", "label"),
        ("task:#5#%2564omain=shared", "label"),
        ("file:///a#x=1;DOMAIN:shared", "label"),
        ("file://example.org/a", "another host"),
        ("file:relative/path", "absolute"),
        ("file:///a%00b", "NUL"),
    ],
)
def test_refs_without_a_canonical_form_are_refused(ref: str, why: str) -> None:
    with pytest.raises(BadRef, match=why if why != "label" else "label is refused"):
        canonical(ref)


def test_prefixes_match_whole_segments_and_follow_symlinks(tmp_path: Path) -> None:
    (tmp_path / "private").mkdir()
    (tmp_path / "alias").symlink_to(tmp_path / "private", target_is_directory=True)
    prefix = canonical_prefix(f"file://{tmp_path}/alias/")
    assert prefix == f"file://{tmp_path}/private/"
    assert under(canonical(f"file://{tmp_path}/alias/x.md").key, prefix)
    assert under(canonical(f"file://{tmp_path}/private").key, prefix)
    assert not under(canonical(f"file://{tmp_path}/privatex/y.md").key, prefix)


def test_the_guard_judges_the_file_that_was_opened(tmp_path: Path, cards: CardSet) -> None:
    shared, private = tmp_path / "shared", tmp_path / "private"
    shared.mkdir()
    private.mkdir()
    (private / "diary.md").write_text("secret\n")
    cfg = PolicyConfig(domains=((f"file://{private}/", "private:alvis"),))
    guard = ReadGuard(Domains(cards, cfg), cards.get("torgash"))
    resolver = RefResolver(roots=[tmp_path], guard=guard)
    (shared / "a.md").write_text("fine\n")
    assert resolver.resolve(f"file://{shared}/a.md") == "fine\n"
    (shared / "a.md").unlink()
    (shared / "a.md").symlink_to(private / "diary.md")
    with pytest.raises(PrivacyViolation, match=r"privacy\.sandboxed"):
        resolver.resolve(f"file://{shared}/a.md")
    os.link(private / "diary.md", shared / "b.md")
    with pytest.raises(PrivacyViolation, match=r"privacy\.hard-link"):
        resolver.resolve(f"file://{shared}/b.md")
    with pytest.raises(PrivacyViolation, match=r"privacy\.unknown"):
        resolver.resolve("task:1")  # no board here: a task's owner is unknown
