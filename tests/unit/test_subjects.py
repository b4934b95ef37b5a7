"""Subjects per tenant, and the reply subjects an instance accepts from the wire."""

from __future__ import annotations

import pytest

from meshpoint.errors import BadMessageError
from meshpoint.runtime.subjects import Subjects, broker_user, tenant_token


def test_every_tenant_has_subjects_and_queues_of_its_own() -> None:
    default, acme = Subjects("travel"), Subjects("travel", "acme")
    assert default.request("coordinator") == "travel.a2a.v1.agent.request.coordinator"
    assert acme.request("coordinator") == "travel.a2a.v1.tenant.acme.agent.request.coordinator"
    assert default.queue("coordinator-requests") == "travel-coordinator-requests"
    assert acme.queue("coordinator-requests") == "travel-coordinator-requests~acme"
    odd = Subjects("travel", "acme corp.eu")  # any tenant id becomes one token
    token = tenant_token("acme corp.eu")
    assert token.startswith("_") and len(token) == 33
    assert odd.root == f"travel.a2a.v1.tenant.{token}"
    assert tenant_token("_x") != "_x"  # a leading underscore marks hashed tokens only
    assert broker_user("travel", "acme", "agent", "coordinator") == \
        "travel.acme.agent.coordinator"


@pytest.mark.parametrize(("kind", "subject"), [
    ("response", "travel.a2a.v1.agent.response.coordinator.s1"),
    ("status", "travel.a2a.v1.agent.status.coordinator.s1"),
    ("response", "travel.a2a.v1.instance.coordinator.i1.response.s1"),
    ("status", "travel.a2a.v1.client.web.sess.status.r1")])
def test_reply_subjects_of_the_right_kind_are_taken(kind: str, subject: str) -> None:
    header = "Meshpoint-Reply-To"
    assert Subjects("travel").reply_subject({header: subject}, header, kind) == subject  # type: ignore[arg-type]


@pytest.mark.parametrize(("subject", "why"), [
    ("other.a2a.v1.agent.response.coordinator.s1", "outside namespace"),
    ("travel.a2a.v1.tenant.acme.agent.response.coordinator.s1", "outside namespace"),
    ("travel.a2a.v1.agent.request.admin", "not a response subject"),
    ("travel.a2a.v1.agent.response.coordinator", "not a response subject"),
    ("travel.a2a.v1.agent.response.coordinator.s1.extra", "not a response subject"),
    ("travel.a2a.v1.client.web.sess.status.r1", "not a response subject"),
    ("travel.a2a.v1.instance.coordinator.i1.response.s1.x", "not a response subject"),
    ("travel.a2a.v1.agent.response.*.s1", "invalid token"),
    ("travel..x", "invalid token")])
def test_other_reply_subjects_are_bad_messages(subject: str, why: str) -> None:
    header = "Meshpoint-Reply-To"
    with pytest.raises(BadMessageError, match=why):
        Subjects("travel").reply_subject({header: subject}, header, "response")
