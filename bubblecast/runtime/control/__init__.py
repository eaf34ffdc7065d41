"""The closed-loop controller: observe -> decide -> broadcast -> apply at step boundaries.

- :mod:`.control_config`: :class:`ControllerConfig` (validated up front, no torch);
- :mod:`.observe`: per-step compute from the recorder's step hook, the rank-0 history and the
  robust speeds the policies read;
- :mod:`.forecasters`: the predictive policy's forecaster;
- :mod:`.decide`: rank 0's :class:`~.decide.Decider` (the policy's ``Decision``, recorded as
  it is; an external decider such as a prediction service is injected by import path);
- :mod:`.decision_thread`: rank 0's decisions off the training thread, deadline-bounded;
- :mod:`.loop`: the collective :class:`~.loop.Controller` (torch; inside workers only);
- :mod:`.job` / :mod:`.control_worker`: launching a controlled run
  (``torchrun -m bubblecast.runtime.control.control_worker JOB_DIR``) and summarising it.
"""

from bubblecast.runtime.control.control_config import ControllerConfig

__all__ = ["ControllerConfig"]
