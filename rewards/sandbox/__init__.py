"""Where verification runs: `pool.py` scores batches in a verifier process of its own, with a
hard time limit per item and a memory cap; `jail.py` isolates a reply's code (new namespaces,
no network, resource limits) and `harness.py` runs it against its tests inside."""
