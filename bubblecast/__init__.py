"""bubblecast: forecast and remove pipeline bubbles in pipeline-parallel training.

The package is a one-way pipeline of stages (telemetry -> sim -> dataset -> forecast ->
policy -> runtime/serve -> cli). Importing ``bubblecast`` is cheap: heavy libraries (torch,
mlflow, lightgbm) load only inside the modules that use them.
"""

__version__ = "0.1.0"

from bubblecast.errors import BubblecastError  # noqa: E402

__all__ = ["BubblecastError", "__version__"]
