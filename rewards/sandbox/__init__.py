"""Where verification runs: `pool.py` scores batches in a verifier process of its own, with a
hard time limit per item and a memory cap; `jail.py` isolates a reply's code (new namespaces,
no network, resource limits), or `reaper.py` launches it unisolated when the user allows that,
and `harness.py` runs it against its tests inside: the code in one process (`candidate.py`),
the tests in another that alone reports (`judge.py`), talking through `wire.py`, the tests'
``==`` checked by `asserts.py`. All but `pool.py` are standard library only."""
