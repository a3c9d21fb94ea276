"""Agent Lightning integration for autogen: captures the framework's LLM, tool and agent calls as spans."""

__all__: list[str] = []
