"""A2A (agent-to-agent protocol, v0.3 JSON shapes) messages, validated at the boundary.

Agents exchange JSON-RPC 2.0 documents: requests ``message/send`` and
``tasks/cancel`` (and meshpoint's own ``meshpoint/handoff``, an operator's request
that a running task hand off to a fresh-context iteration), and responses whose
``result`` is a ``Task``, a ``Message``, a ``TaskStatusUpdateEvent`` or a
``TaskArtifactUpdateEvent`` (told apart by ``kind``). Field names are camelCase on
the wire and snake_case in Python.

:func:`parse_request` and :func:`parse_response` (and :func:`parse_json`, which they
and meshpoint's own control messages use) are the only way bytes from the broker
become objects: anything malformed, nested too deeply, of an unknown method or
kind, or larger than ``max_bytes`` raises :class:`~meshpoint.errors.BadMessageError`
with a reason fit for a dead-letter header. They never raise anything else.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated, Any, Literal, TypeVar

from pydantic import BaseModel, ConfigDict, Field, TypeAdapter, ValidationError
from pydantic.alias_generators import to_camel

from meshpoint.errors import BadMessageError

#: Default largest message accepted from the wire (1 MiB).
MAX_MESSAGE_BYTES = 1 << 20
T = TypeVar("T")


class _Model(BaseModel):
    model_config = ConfigDict(alias_generator=to_camel, populate_by_name=True,
                              frozen=True, extra="ignore")


class TextPart(_Model):
    kind: Literal["text"] = "text"
    text: str
    metadata: dict[str, Any] | None = None


class DataPart(_Model):
    kind: Literal["data"] = "data"
    data: dict[str, Any]
    metadata: dict[str, Any] | None = None


class FileContent(_Model):
    name: str | None = None
    mime_type: str | None = None
    uri: str | None = None
    bytes: str | None = None  # base64, as the protocol sends it


class FilePart(_Model):
    kind: Literal["file"] = "file"
    file: FileContent
    metadata: dict[str, Any] | None = None


Part = Annotated[TextPart | DataPart | FilePart, Field(discriminator="kind")]


class Message(_Model):
    """One turn of conversation between a user (or calling agent) and an agent."""

    kind: Literal["message"] = "message"
    role: Literal["user", "agent"]
    parts: list[Part] = Field(min_length=1)
    message_id: str = Field(min_length=1)
    context_id: str | None = None
    task_id: str | None = None
    metadata: dict[str, Any] | None = None

    @property
    def text(self) -> str:
        """The text parts joined, for models and logs."""
        return "".join(part.text for part in self.parts if isinstance(part, TextPart))


class TaskState(StrEnum):
    SUBMITTED = "submitted"
    WORKING = "working"
    INPUT_REQUIRED = "input-required"
    COMPLETED = "completed"
    CANCELED = "canceled"
    FAILED = "failed"
    REJECTED = "rejected"
    AUTH_REQUIRED = "auth-required"
    UNKNOWN = "unknown"

    @property
    def is_final(self) -> bool:
        return self in (TaskState.COMPLETED, TaskState.CANCELED, TaskState.FAILED,
                        TaskState.REJECTED)


class TaskStatus(_Model):
    state: TaskState
    message: Message | None = None
    timestamp: str | None = None


class Artifact(_Model):
    artifact_id: str = Field(min_length=1)
    name: str | None = None
    parts: list[Part] = Field(min_length=1)
    metadata: dict[str, Any] | None = None


class Task(_Model):
    kind: Literal["task"] = "task"
    id: str = Field(min_length=1)
    context_id: str
    status: TaskStatus
    artifacts: list[Artifact] = Field(default_factory=list)
    history: list[Message] = Field(default_factory=list)
    metadata: dict[str, Any] | None = None


class _TaskEvent(_Model):
    """What every streamed update of a task carries."""

    task_id: str = Field(min_length=1)
    context_id: str
    metadata: dict[str, Any] | None = None


class TaskStatusUpdateEvent(_TaskEvent):
    kind: Literal["status-update"] = "status-update"
    status: TaskStatus
    final: bool


class TaskArtifactUpdateEvent(_TaskEvent):
    kind: Literal["artifact-update"] = "artifact-update"
    artifact: Artifact
    append: bool | None = None
    last_chunk: bool | None = None


class MessageSendParams(_Model):
    message: Message
    metadata: dict[str, Any] | None = None


class TaskIdParams(_Model):
    id: str = Field(min_length=1)
    metadata: dict[str, Any] | None = None


RequestId = Annotated[str | int, Field(union_mode="left_to_right")]


class SendMessageRequest(_Model):
    jsonrpc: Literal["2.0"] = "2.0"
    id: RequestId
    method: Literal["message/send"] = "message/send"
    params: MessageSendParams


class CancelTaskRequest(_Model):
    jsonrpc: Literal["2.0"] = "2.0"
    id: RequestId
    method: Literal["tasks/cancel"] = "tasks/cancel"
    params: TaskIdParams


class HandoffParams(_Model):
    """Which task hands off, and why (the operator's words, kept in its record)."""

    id: str = Field(min_length=1, max_length=255)
    reason: str = Field(default="", max_length=1000)


class HandoffTaskRequest(_Model):
    """meshpoint's own method (not A2A's): the instance running task ``params.id``
    ends its iteration before its next model call, and a fresh-context one carries it
    on (``meshpoint tasks handoff``, :meth:`meshpoint.runtime.Client.handoff`)."""

    jsonrpc: Literal["2.0"] = "2.0"
    id: RequestId
    method: Literal["meshpoint/handoff"] = "meshpoint/handoff"
    params: HandoffParams


AnyRequest = SendMessageRequest | CancelTaskRequest | HandoffTaskRequest
Request = Annotated[AnyRequest, Field(discriminator="method")]
Result = Annotated[Task | Message | TaskStatusUpdateEvent | TaskArtifactUpdateEvent,
                   Field(discriminator="kind")]


class JSONRPCError(_Model):
    code: int
    message: str
    data: Any = None


class SuccessResponse(_Model):
    jsonrpc: Literal["2.0"] = "2.0"
    id: RequestId | None = None  # null (or absent) when the request's id was unreadable
    result: Result


class ErrorResponse(_Model):
    jsonrpc: Literal["2.0"] = "2.0"
    id: RequestId | None = None
    error: JSONRPCError


Response = SuccessResponse | ErrorResponse

_REQUESTS: TypeAdapter[AnyRequest] = TypeAdapter(Request)
_RESPONSES: TypeAdapter[Response] = TypeAdapter(Response)
_METHODS = ("message/send", "tasks/cancel", "meshpoint/handoff")


def encode(document: _Model) -> bytes:
    """The wire form of a request, response or result: camelCase JSON bytes."""
    return document.model_dump_json(by_alias=True, exclude_none=True).encode()


def parse_request(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> AnyRequest:
    """Validate a JSON-RPC request from the wire, or raise BadMessageError."""
    return parse_json(_REQUESTS, "request", data, max_bytes)


def parse_response(data: bytes, *, max_bytes: int = MAX_MESSAGE_BYTES) -> Response:
    """Validate a JSON-RPC response from the wire, or raise BadMessageError."""
    return parse_json(_RESPONSES, "response", data, max_bytes)


def parse_json(adapter: TypeAdapter[T], what: str, data: bytes, max_bytes: int) -> T:
    """``data`` validated by ``adapter``, or BadMessageError naming what is wrong with
    the ``what``: too large, not JSON, nested too deeply, or not of its shape. The
    boundary where bytes from the wire become objects: nothing else escapes it
    (pydantic's parser stops at its own depth limit; a RecursionError from deeper
    down is caught here too)."""
    _check_size(data, max_bytes)
    try:
        return adapter.validate_json(data)
    except ValidationError as error:
        raise BadMessageError(_explain(what, error, data)) from None
    except RecursionError:
        raise BadMessageError(f"the {what} is {_TOO_DEEP}") from None


def _check_size(data: bytes, max_bytes: int) -> None:
    if type(data) is not bytes:
        raise BadMessageError(f"a message must be bytes, got {type(data).__name__}")
    if len(data) > max_bytes:
        raise BadMessageError(
            f"message of {len(data):,} bytes is larger than the limit of {max_bytes:,}")


_TOO_DEEP = "nested too deeply to be read (JSON nested past the parser's limit)"


def _explain(what: str, error: ValidationError, data: bytes) -> str:
    first = error.errors(include_url=False)[0]
    if first["type"] == "json_invalid" and "recursion limit" in str(first["msg"]):
        return f"the {what} is {_TOO_DEEP}"
    if first["type"] == "json_invalid":
        return f"the {what} is not valid JSON: {first['msg']}"
    if first["type"] == "union_tag_invalid" and not first["loc"]:
        tag = first.get("input", {})
        method = tag.get("method") if isinstance(tag, dict) else None
        if what == "request":
            return f"unknown method {method!r}; meshpoint accepts {', '.join(_METHODS)}"
    where = ".".join(str(part) for part in first["loc"]) or what
    extra = f" (and {error.error_count() - 1} more problems)" if error.error_count() > 1 else ""
    label = f"A2A {what}" if what in ("request", "response") else what
    return f"invalid {label}: {where}: {first['msg']}{extra}"
