"""Layer 7: adapters for other agent frameworks, built on the portal and the wire layer.

``zidane_actors.integrations.openai_agents`` (extra ``openai-agents``),
``zidane_actors.integrations.pydantic_ai`` (extra ``pydantic-ai``),
``zidane_actors.integrations.adk`` (extra ``adk``),
``zidane_actors.integrations.langgraph`` (extra ``langgraph``) and
``zidane_actors.integrations.otel`` (extra ``otel``: GenAI spans recorded as
runs) import their framework; this package itself imports none of them.
openai-agents' ``ZidaneSession`` has ``AdvancedSQLiteSession``'s branch
operations (``_agents_branches``); pydantic-ai has
``ZidaneConversationStore`` (``_pydantic_ai_store``).
"""

__all__: list[str] = []
