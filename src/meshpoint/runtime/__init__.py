"""The runtime: agents, their instances, and a client to submit tasks."""

from meshpoint.runtime.agent import Agent, LocalTool, Peer, RuntimeOptions, ToolCallInfo
from meshpoint.runtime.client import Client, NextStep
from meshpoint.runtime.instance import AgentInstance
from meshpoint.runtime.stats import InstanceStats

__all__ = ["Agent", "AgentInstance", "Client", "InstanceStats", "LocalTool", "NextStep",
           "Peer", "RuntimeOptions", "ToolCallInfo"]
