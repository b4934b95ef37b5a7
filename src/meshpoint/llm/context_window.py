"""A model server's context window, where the server says it: what a handoff's
context-utilization trigger measures against (:class:`~meshpoint.llm.openai.OpenAIModel`
asks once, when no ``context_window`` is configured)."""

from __future__ import annotations

import logging
from typing import Any

logger = logging.getLogger("meshpoint.llm")

#: Seconds the one look-up of a server's context window may take, at most.
WINDOW_LOOKUP_TIMEOUT_S = 5.0


async def server_context_window(base_url: str, name: str, *, api_key: str | None = None,
                                timeout_s: float = WINDOW_LOOKUP_TIMEOUT_S) -> int | None:
    """The context window (tokens per request) the server at ``base_url`` says model
    ``name`` has, or None if it does not say: llama.cpp's ``GET /props``
    (``default_generation_settings.n_ctx``, a slot's share of ``--ctx-size``), else
    vLLM's ``GET {base_url}/models`` (the model's ``max_model_len``). Never raises: a
    server that is down, answers 404 or something else is a server that does not
    say (logged)."""
    import httpx

    base = base_url.rstrip("/")
    root = base[:-3] if base.endswith("/v1") else base
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        async with httpx.AsyncClient(timeout=timeout_s, headers=headers) as http:
            props = await http.get(f"{root}/props")
            if props.status_code == 200:
                body = props.json()
                settings = body.get("default_generation_settings") if isinstance(
                    body, dict) else None
                window = _positive((settings or {}).get("n_ctx") if isinstance(
                    settings, dict) else None) or _positive(
                    body.get("n_ctx") if isinstance(body, dict) else None)
                if window is not None:
                    return window
            models = await http.get(f"{base}/models")
            if models.status_code == 200:
                data = models.json()
                listed = data.get("data") if isinstance(data, dict) else None
                listed = listed if isinstance(listed, list) else []
                for entry in listed:
                    if isinstance(entry, dict) and (entry.get("id") == name or
                                                    len(listed) == 1):
                        window = _positive(entry.get("max_model_len"))
                        if window is not None:
                            return window
    except (httpx.HTTPError, ValueError) as error:
        logger.info("model %r: the server at %s did not say its context window (%s)",
                    name, root, error)
        return None
    logger.info("model %r: the server at %s does not say its context window (no "
                "/props n_ctx, no max_model_len); set context_window to measure it", name,
                root)
    return None


def _positive(value: Any) -> int | None:
    return value if type(value) is int and value > 0 else None
