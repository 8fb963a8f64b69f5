"""Adapters for other agent frameworks, built on the portal and the wire layer.

``zidane_actors.integrations.openai_agents`` (extra ``openai-agents``),
``zidane_actors.integrations.pydantic_ai`` (extra ``pydantic-ai``),
``zidane_actors.integrations.adk`` (extra ``adk``),
``zidane_actors.integrations.langgraph`` (extra ``langgraph``) and
``zidane_actors.integrations.otel`` (extra ``otel``: GenAI spans recorded as
runs) import their framework; this package itself imports none of them.
"""

__all__: list[str] = []
