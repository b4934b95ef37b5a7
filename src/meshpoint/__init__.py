"""meshpoint: AI agents that are stateless while they wait.

A task that pauses (waiting on peer agents, a human, or a fresh-context
iteration) is checkpointed to a database in one transaction; any instance can
take the next event, claim it exactly once, and resume the task.
"""

from meshpoint.context import ParallelCalls, TaskExecutionContext, TokenUsage
from meshpoint.store import open_store

__all__ = ["ParallelCalls", "TaskExecutionContext", "TokenUsage", "open_store"]
__version__ = "0.1.0"
