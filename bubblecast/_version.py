"""The package version, in a module of its own.

Layers below the CLI import ``__version__`` from here, not from ``bubblecast``: importing the
package root would count (for import-linter) as importing every layer its lazy exports name.
``pyproject.toml`` reads the version from here too (``[tool.setuptools.dynamic]``).
"""

__version__ = "0.1.0"
