"""The embedded board's permission table covers every procedure it answers."""

from __future__ import annotations

from fabric.embedded.permissions import MANAGER, MEMBER, VIEWER, has_rule, required_role
from fabric.embedded.rpc import procedure_names


def test_every_procedure_has_a_rule_for_users() -> None:
    # A procedure without one is refused to every user: say what Kanboard requires
    # (fabric/embedded/permissions.py) when adding one to the board.
    assert sorted(m for m in procedure_names() if not has_rule(m)) == []


def test_the_roles_follow_kanboard_s_project_access_map() -> None:
    assert required_role("searchTasks") == VIEWER
    assert required_role("getTaskMetadata") == VIEWER
    assert required_role("saveTaskMetadata") == MEMBER
    assert required_role("createTag") == MEMBER
    assert required_role("removeTag") == MEMBER
    assert required_role("createComment") == MEMBER
    assert required_role("addSwimlane") == MANAGER
    assert required_role("addProjectUser") == MANAGER
