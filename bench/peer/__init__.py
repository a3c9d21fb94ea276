"""Side workers of the side-by-side comparison: ``ours.py`` runs in ``.venv``, ``theirs.py`` in ``.venv-peer``.

Both answer the same measurement requests (``bench._util.serve_measurements``) with the same workloads, each through
its own package's public API, so ``bench.compare`` can interleave their runs on the same machine.
"""
