"""Which bank a task's result may be retained into (:func:`fabric.domains.check_retain`):
only one of the task's own privacy domain, never across people."""

from __future__ import annotations

import pytest

from fabric.domains import UNKNOWN, check_retain
from fabric.errors import EXIT_POLICY
from fabric.refusals import PrivacyViolation


def refused(found: set[str], bank: str, domain: str) -> PrivacyViolation:
    with pytest.raises(PrivacyViolation) as err:
        check_retain(7, found, bank, domain)
    assert err.value.exit_code == EXIT_POLICY
    assert len(err.value.line().splitlines()) == 1
    return err.value


def test_a_result_goes_into_a_bank_of_its_own_domain() -> None:
    check_retain(7, {"private:ada"}, "adolf-ada", "private:ada")
    check_retain(7, {"private:ada", "shared"}, "adolf-ada", "private:ada")  # shared context too
    check_retain(7, {"shared"}, "household", "shared")


def test_a_task_of_ada_is_refused_into_bobs_bank() -> None:
    err = refused({"private:ada"}, "adolf-bob", "private:bob")
    assert err.rule == "privacy.retain" and "private:ada" in err.what and "adolf-bob" in err.what


def test_nothing_private_goes_into_a_shared_bank() -> None:
    assert refused({"private:ada", "shared"}, "household", "shared").rule == "privacy.retain"


def test_work_of_two_people_goes_into_neither_bank() -> None:
    for bank, domain in (("adolf-ada", "private:ada"), ("adolf-bob", "private:bob")):
        assert refused({"private:ada", "private:bob"}, bank, domain).rule == "privacy.retain"


def test_shared_work_does_not_go_into_a_persons_bank() -> None:
    # It did not work in ada's domain: her memory holds what her own work produced.
    assert refused({"shared"}, "adolf-ada", "private:ada").rule == "privacy.retain"


def test_an_unowned_bank_or_an_undecidable_task_is_refused() -> None:
    assert refused({"private:ada"}, "nobody", UNKNOWN).rule == "privacy.unknown"
    assert refused({"private:ada", UNKNOWN}, "adolf-ada", "private:ada").rule == "privacy.unknown"
