"""Brokers: how agents' messages travel. See :mod:`meshpoint.broker.base`.

:func:`open_broker` picks the implementation from a URL: ``memory://`` is the
in-process broker (one process), ``nats://host:port`` is NATS JetStream (imported
lazily, so the embedded default needs no NATS client).
"""

from __future__ import annotations

from typing import Any

from meshpoint.broker.base import Broker, ConsumerOptions, Delivery, Message, Subscription
from meshpoint.broker.inprocess import InProcessBroker
from meshpoint.errors import ConfigurationError


async def open_broker(url: str, **options: Any) -> Broker:
    """A broker for ``url``: ``memory://`` or ``nats://host:port`` (``tls://`` too).
    ``options`` go to the implementation (see :class:`meshpoint.broker.nats.NatsBroker`;
    ``tls=``, a :class:`meshpoint.tls.TlsConfig`, requires TLS to NATS)."""
    if url in ("memory://", "memory"):
        if options.pop("tls", None) is not None:
            raise ConfigurationError(f"broker.tls is for NATS; {url} reaches agents in "
                                     "this process only, with no network")
        return InProcessBroker(**options)
    if url.startswith(("nats://", "tls://")):
        try:
            from meshpoint.broker.nats import NatsBroker
        except ImportError:  # pragma: no cover - the extra is missing
            raise ConfigurationError("the NATS broker needs the nats extra: "
                                     "pip install 'meshpoint[nats]'") from None
        return await NatsBroker.connect(url, **options)
    raise ConfigurationError(f"unknown broker URL {url!r}: use memory:// (one process) "
                             f"or nats://host:4222 (NATS JetStream)")


__all__ = ["Broker", "ConsumerOptions", "Delivery", "InProcessBroker", "Message",
           "Subscription", "open_broker"]
