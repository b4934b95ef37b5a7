"""The demos: the main job on the embedded default.

* :mod:`~meshpoint.demo.scripted`: ``meshpoint demo`` (``make demo``), with the
  deterministic scripted model; :mod:`~meshpoint.demo.handoffs`: its long tasks, which
  hand off to fresh-context iterations;
* :mod:`~meshpoint.demo.llm`: ``python -m meshpoint.demo.llm`` (``make demo-llm``), the
  same job with a real model behind an OpenAI-compatible endpoint.

The demos may import every other part of meshpoint; nothing but the CLI imports them.
"""
