"""SQL example: a LangGraph writer/checker/rewriter agent trained with Agent Lightning (see README.md)."""
