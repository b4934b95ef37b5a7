"""Each agent's A2A agent card, from the mesh config: its name and description, one
skill for what it does (its tools and peers as tags), and the capabilities the
gateway really serves: streaming yes (read from the store), push notifications no,
and, with tokens, the bearer scheme every request must use."""

from __future__ import annotations

from typing import Any

from a2a.types.a2a_pb2 import (
    AgentCapabilities,
    AgentCard,
    AgentInterface,
    AgentSkill,
    HTTPAuthSecurityScheme,
    SecurityRequirement,
    SecurityScheme,
)
from a2a.utils.constants import PROTOCOL_VERSION_0_3, PROTOCOL_VERSION_1_0

#: The name of the bearer scheme in a card's ``securitySchemes``.
BEARER = "bearer"
#: The MIME types every agent takes and gives: words, or a data part (an answer).
MODES = ["text/plain", "application/json"]


def agent_card(name: str, spec: Any, base_url: str, *, version: str,
               bearer: bool) -> AgentCard:
    """The card of agent ``name`` (``spec``: its AgentConfig) served at ``base_url``."""
    tags = [t.name for t in spec.tools] + [p.agent for p in spec.peers] + \
        [str(s.agent if hasattr(s, "agent") else s) for s in spec.sub_agents]
    description = spec.description or f"the meshpoint agent {name}"
    card = AgentCard(
        name=name, description=description, version=version,
        # Both versions at one URL: a 1.x client picks 1.0; the 0.3 interface makes
        # the SDK add 0.3's own fields (url, protocolVersion, preferredTransport),
        # without which a 0.3 client cannot read the card at all.
        supported_interfaces=[AgentInterface(url=base_url, protocol_binding="JSONRPC",
                                             protocol_version=protocol)
                              for protocol in (PROTOCOL_VERSION_1_0, PROTOCOL_VERSION_0_3)],
        capabilities=AgentCapabilities(streaming=True, push_notifications=False),
        default_input_modes=MODES, default_output_modes=MODES,
        skills=[AgentSkill(id=name, name=name, description=description,
                           tags=tags or [name])])
    if bearer:
        # (Its description has no word a checker of public cards takes for a leak.)
        card.security_schemes[BEARER].CopyFrom(SecurityScheme(
            http_auth_security_scheme=HTTPAuthSecurityScheme(
                scheme="Bearer",
                description="issued by the gateway's operator, one per client")))
        requirement = SecurityRequirement()
        requirement.schemes[BEARER].SetInParent()
        card.security_requirements.append(requirement)
    return card
