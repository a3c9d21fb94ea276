"""Agent Lightning integration for langchain: captures the framework's LLM, tool and agent calls as spans."""

__all__: list[str] = []
