"""``bubblecast demo``: the whole journey on embedded defaults, with a report.

Stages (one module function each, committed atomically into ``<out>/<stage>/``): simulate a
scenario suite, build the dataset, train LightGBM and the sequence model (logged and
registered in ``<out>/mlflow.db``), evaluate forecasters and policies on held-out runs,
inspect the real Megatron-LM trace, run the live closed loop on CPU; then ``report.md``.

``from bubblecast.demo import run_demo, preset``: nothing heavy loads with this package.
"""

from bubblecast.demo.config import DemoConfig, preset
from bubblecast.demo.run import STAGES, DemoResult, figures, run_demo

__all__ = ["STAGES", "DemoConfig", "DemoResult", "figures", "preset", "run_demo"]
