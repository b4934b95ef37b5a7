"""Brokers: how agents' messages travel. See :mod:`meshpoint.broker.base`."""

from meshpoint.broker.base import Broker, ConsumerOptions, Delivery, Message, Subscription
from meshpoint.broker.inprocess import InProcessBroker

__all__ = ["Broker", "ConsumerOptions", "Delivery", "InProcessBroker", "Message",
           "Subscription"]
