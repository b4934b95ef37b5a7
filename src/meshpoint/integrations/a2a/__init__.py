"""A2A over HTTP: a mesh's agents as A2A servers any A2A client talks to
(``meshpoint gateway``, docs/a2a.md), and the store as an a2a-sdk ``TaskStore``.

* :mod:`~meshpoint.integrations.a2a.app`: the HTTP application (the a2a-sdk's routes per agent
  behind the checks of size, content type and bearer token) and ``serve_gateway``;
* :mod:`~meshpoint.integrations.a2a.handler`: the a2a-sdk request handler that turns A2A calls
  into meshpoint requests, answers and cancels, holding no task in memory;
* :mod:`~meshpoint.integrations.a2a.views`: a task as A2A shows it, read from the store (the
  gateway's event-log entries, the checkpoint history, the live rows);
* :mod:`~meshpoint.integrations.a2a.cards`: each agent's agent card, from the config;
* :mod:`~meshpoint.integrations.a2a.task_store`: :class:`StoreTaskStore`, an a2a-sdk ``TaskStore``
  on a meshpoint store, for those who build their own A2A server.

Needs the ``gateway`` extra (``a2a-sdk[http-server]``, ``uvicorn``). It may import the
runtime, the store, the events and the config; only the CLI imports it.
"""
