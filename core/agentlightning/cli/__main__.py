"""``python -m agentlightning.cli``: the ``agl`` command."""

from agentlightning.cli import main

main()
