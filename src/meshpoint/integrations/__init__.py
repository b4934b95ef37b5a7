"""Integrations of meshpoint's store and mesh with other frameworks. Each needs its
framework installed and is imported only when asked for:

* :mod:`~meshpoint.integrations.langgraph`: a LangGraph checkpoint saver on the store
  (``pip install 'meshpoint[langgraph]'``);
* :mod:`~meshpoint.integrations.a2a`: the A2A-over-HTTP gateway (``meshpoint gateway``) on
  ``a2a-sdk``'s server, and ``StoreTaskStore``, an ``a2a-sdk`` ``TaskStore`` on the store
  (``pip install 'meshpoint[gateway]'``).
"""
