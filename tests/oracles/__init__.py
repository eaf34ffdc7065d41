"""Test oracles: slow, obviously correct reference implementations checked against the library."""
