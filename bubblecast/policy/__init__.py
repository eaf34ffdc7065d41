"""Policy: turn forecasts into actions and evaluate policies offline.

- :mod:`~bubblecast.policy.actions`: the action objects (shared with runtime and service);
- :mod:`~bubblecast.policy.solver`: exact contiguous partition solver (min bottleneck);
- :mod:`~bubblecast.policy.cost`: migration cost model and measured constants;
- :mod:`~bubblecast.policy.forecasting`: per-rank speed forecasts (built-in or trained model);
- :mod:`~bubblecast.policy.decision`: the Decision every policy returns (action and numbers);
- :mod:`~bubblecast.policy.state`: what a policy sees, and the planning-speed formula;
- :mod:`~bubblecast.policy.policies`: static, reactive, predictive and oracle policies;
- :mod:`~bubblecast.policy.api`: public ``Policy`` objects and ``evaluate_policies``;
- :mod:`~bubblecast.policy.run_data`: a run's data for counterfactual evaluation (ground
  truth, or replay-rescaled for logged runs). Step timing lives in
  :mod:`bubblecast.sim.steptime`;
- :mod:`~bubblecast.policy.policy_evaluation`: offline evaluation behind ``bubblecast policy-eval``.

Submodules are imported where needed (nothing heavy loads with this package).
"""
