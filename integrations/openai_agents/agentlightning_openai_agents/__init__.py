"""Agent Lightning integration for openai_agents: captures the framework's LLM, tool and agent calls as spans."""

__all__: list[str] = []
