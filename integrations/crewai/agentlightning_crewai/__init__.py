"""Agent Lightning integration for crewai: captures the framework's LLM, tool and agent calls as spans."""

__all__: list[str] = []
