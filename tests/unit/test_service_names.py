"""What the operator's tools say of a service that is not there (issue 47): the closest names there
are, else the names there are, else that there are none; and which keys name a service."""

from __future__ import annotations

import pickle

import pytest

import lbs
from lbs.status.services import missing_message, new_service_message, service_of

WHERE = "redis://user:***@h:6379/0"


@pytest.mark.parametrize(
    "key, service",
    [
        ("jobs-input", "jobs"),
        ("my jobs-input", "my jobs"),
        ("a-input-input", "a-input"),
        ("orders.3-input", "orders.3"),
        ("-input", None),
        ("jobs", None),
        ("{jobs-input}:k:x-input", None),  # a keyed stream of a service, not a service
        ("{jobs}-input", None),  # a service's name has no brace
    ],
)
def test_which_keys_name_a_service(key: str, service: str | None) -> None:
    assert service_of(key) == service


def test_a_close_name_is_suggested() -> None:
    assert (
        missing_message("jbos", ["emails", "jobs"], WHERE)
        == f"no service 'jbos' on {WHERE}; did you mean 'jobs'?"
    )
    said = missing_message("job", ["jobs", "jobz", "x"], WHERE)
    # The closest first (a tie: difflib's order).
    assert said.endswith("did you mean 'jobz' or 'jobs'?")


def test_without_a_close_name_the_names_there_are_listed_or_their_absence_said() -> None:
    assert (
        missing_message("zzz", ["emails", "jobs"], WHERE)
        == f"no service 'zzz' on {WHERE}; the services there: 'emails', 'jobs'"
    )
    many = [f"svc{i:02}" for i in range(13)]
    said = missing_message("zzz", many, WHERE)
    assert "'svc09'" in said and "'svc10'" not in said
    assert said.endswith("and 3 more (lbs services lists them)")
    assert (
        missing_message("zzz", [], WHERE)
        == f"no service 'zzz' on {WHERE}; it has no services (no stream named SERVICE-input)"
    )


def test_names_the_acl_does_not_let_list_are_not_guessed() -> None:
    assert missing_message("x", None, WHERE) == (
        f"no service 'x' on {WHERE} (the services there could not be listed: the ACL refuses SCAN)"
    )
    assert new_service_message("x", None, WHERE).endswith(
        "starting it (the services there could not be listed: the ACL refuses SCAN)"
    )


def test_a_sharded_name_is_compared_with_the_sharded_services() -> None:
    names = ["orders.0~3", "orders.1", "emails"]  # lbs._placement's names
    assert missing_message("ordres", names, WHERE, shards=2).endswith("did you mean 'orders'?")
    said = new_service_message("ordres", names, WHERE, shards=2)
    assert said.endswith("starting it (did you mean 'orders'?)")


def test_the_worker_says_it_starts_a_new_service() -> None:
    assert (
        new_service_message("jbos", ["jobs", "emails"], WHERE)
        == f"service 'jbos' does not exist on {WHERE} yet: starting it (did you mean 'jobs'?)"
    )
    assert (
        new_service_message("my jobs", ["a", "b"], WHERE)
        == f"service 'my jobs' does not exist on {WHERE} yet: starting it (existing: a, b)"
    )
    assert new_service_message("new", [], WHERE).endswith("starting it (existing: none)")


def test_no_such_service_is_a_misuse_and_survives_pickling() -> None:
    err = lbs.NoSuchServiceError("no service 'x' on h; did you mean 'y'?", "x", ("y",))
    assert isinstance(err, lbs.InterfaceError) and isinstance(err, LookupError)
    assert not isinstance(err, lbs.ConfigurationError)  # the commands exit 1 on it, not 78
    back = pickle.loads(pickle.dumps(err))
    assert (str(back), back.service, back.suggestions) == (str(err), "x", ("y",))
