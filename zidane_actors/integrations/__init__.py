"""Adapters for other agent frameworks, built on the portal and the wire layer.

``zidane_actors.integrations.openai_agents`` (extra ``openai-agents``) and
``zidane_actors.integrations.pydantic_ai`` (extra ``pydantic-ai``) import
their framework; this package itself imports neither.
"""

__all__: list[str] = []
