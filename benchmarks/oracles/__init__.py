"""Reference oracles: slow, obviously correct implementations that the tests check the library
against and the benchmarks time it against.

They live here, beside the load generator, because both folders use them: tests import from
``benchmarks`` (``benchmarks.oracles``, ``benchmarks.loadgen``), benchmarks never import from
``tests`` (``tests/test_benchmarks_imports.py`` checks it), so the two folders have no cycle.
"""
