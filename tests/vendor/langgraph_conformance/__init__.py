"""langgraph-checkpoint-conformance: conformance test suite for checkpointer implementations."""

from tests.vendor.langgraph_conformance.initializer import checkpointer_test
from tests.vendor.langgraph_conformance.validate import validate

__all__ = [
    "checkpointer_test",
    "validate",
]
