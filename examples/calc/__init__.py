"""Calc example: an AutoGen AssistantAgent with a calculator tool trained with Agent Lightning (see README.md)."""
