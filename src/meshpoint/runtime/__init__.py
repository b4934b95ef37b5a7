"""The runtime: agents (and workflow agents), their instances, and a client to submit
tasks."""

from meshpoint.runtime.agent import Agent, LocalTool, Peer, RuntimeOptions, ToolCallInfo
from meshpoint.runtime.client import Client, NextStep
from meshpoint.runtime.instance import AgentInstance
from meshpoint.runtime.stats import InstanceStats
from meshpoint.runtime.workflows import LoopAgent, ParallelAgent, SequentialAgent, SubAgent

__all__ = ["Agent", "AgentInstance", "Client", "InstanceStats", "LocalTool", "LoopAgent",
           "NextStep", "ParallelAgent", "Peer", "RuntimeOptions", "SequentialAgent", "SubAgent",
           "ToolCallInfo"]
