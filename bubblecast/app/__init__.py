"""Applications over the public API, above every library layer and below the CLI.

- :mod:`~bubblecast.app.demo`: ``bubblecast demo``, the end-to-end example (its stages);
- :mod:`~bubblecast.app.demo_report`: the demo's ``report.md``, figures and strict JSON (reads
  the demo's JSON only).

Submodules are imported where needed (nothing loads with this package).
"""
