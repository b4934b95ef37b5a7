"""Integrations of meshpoint's store with other frameworks (``langgraph``: a LangGraph
checkpoint saver). Each needs its framework installed (``pip install
'meshpoint[langgraph]'``) and is imported only when asked for."""
