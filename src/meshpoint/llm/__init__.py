"""Models: the protocol, a deterministic scripted model, an OpenAI-compatible adapter."""

from meshpoint.llm.base import Model, ModelResponse, ToolCall, ToolSpec, Usage
from meshpoint.llm.scripted import ScriptedModel

__all__ = ["Model", "ModelResponse", "ScriptedModel", "ToolCall", "ToolSpec", "Usage"]
