"""``ServiceDecider``: the live controller asking a prediction service for its decisions.

``bubblecast run --service URL`` injects this class into the runtime by its import path
(``"bubblecast.serve.decider:ServiceDecider"``; runtime never imports serve): rank 0's
controller builds one with ``(url, timeout_s, params)`` and calls :meth:`decide` with the
policy's state plus the raw per-step compute and held work, instead of running the policy
itself. The service's ``/v1/recommend`` answer is returned as the policy's
:class:`~bubblecast.policy.decision.Decision`, recorded as it is.

Fail-open: a service that is down, slow or refuses the request yields a decision to keep the
current plan whose reason says why (``timeout_s`` bounds each call, retries included).

Each request names this decider's run (:attr:`ServiceDecider.run_id`, one per decider) and the
step number of its history's newest row (:attr:`ServiceDecider.step`, set by the controller
before each decision), so the service plans on intervals adapted to the run across its
requests, as the policy layer does in process (:mod:`bubblecast.serve.run_intervals`).
"""

from __future__ import annotations

import os
import socket
from typing import Any

import numpy as np

from bubblecast.policy.decision import Decision

#: Steps of history sent with each request (the newest).
MAX_STEPS = 1024


class ServiceDecider:
    """Asks a prediction service for the predictive policy's action (fail-open).

    ``params`` are the predictive policy's knobs (horizon, risk, margin, min_gain, hold,
    min_history), sent with every request.
    """

    def __init__(self, url: str, timeout_s: float, params: dict[str, Any]) -> None:
        from bubblecast.serve.client import Client

        self.url = url
        self.client = Client(url, timeout=timeout_s, retries=1)
        self.params = params
        self.horizons: list[int] | None = None
        self.name = f"service {url}"
        # the service keys its per-run interval state by this (unique per decider process)
        self.run_id = f"{socket.gethostname()}-{os.getpid()}-{id(self):x}"
        self.step: int | None = None  # the newest history row's step number (the controller's)

    def _keep(self, why: str) -> Decision:
        return Decision.keep(f"service {self.url}: {why}; keeping the current plan")

    def _model_horizons(self) -> list[int] | str:
        """The served model's horizons (``/v1/model``), asked once; [1] when unknown; why not,
        when the service cannot be reached."""
        if self.horizons is None:
            breaker = self.client.breaker
            if not breaker.allow():
                return "circuit open after failures"
            try:
                resp = self.client.fetch("/v1/model")
                hz = resp.json().get("horizons") if resp.status_code == 200 else None
            except Exception as exc:  # noqa: BLE001 - fail open
                breaker.record_failure()
                return f"unavailable ({type(exc).__name__})"
            breaker.record_success()
            self.horizons = [int(h) for h in hz] if hz else [1]
        return self.horizons

    def request(self, state: Any, compute: np.ndarray, held: np.ndarray,
                horizons: list[int]) -> dict[str, Any]:
        """The ``/v1/recommend`` body for ``state`` (a ``PolicyState``), ``compute`` and
        ``held`` (``(T, P)`` compute seconds and layer cost held per step)."""
        compute, held = compute[-MAX_STEPS:], held[-MAX_STEPS:]
        pipe, migration = state.pipeline, state.migration
        c = migration.constants
        since = None if state.last_action is None else max(state.t - state.last_action, 0)
        ranks = [{"rank": r, "stage": r, "compute_s": compute[:, r].tolist(),
                  "work": np.maximum(held[:, r], 1e-12).tolist()} for r in range(pipe.stages)]
        return {"pipeline": {"schedule": pipe.schedule, "stages": pipe.stages,
                             "microbatches": pipe.microbatches, "chunks": pipe.chunks},
                "horizons": horizons, "ranks": ranks,
                "partition": list(state.partition), "layer_costs": state.costs.tolist(),
                "migration": {"param_bytes": migration.param_bytes.tolist(),
                              "bandwidth_bytes_per_s": c.bandwidth_Bps,
                              "pause_s": c.fixed_pause_s,
                              "optimizer_factor": c.optimizer_factor},
                "policy": self.params, "steps_since_action": since,
                **({} if self.step is None else {"run_id": self.run_id, "step": self.step})}

    def decide(self, state: Any, compute: np.ndarray, held: np.ndarray) -> Decision:
        """The service's decision for ``state``; a keep-the-plan one when it gives none."""
        from bubblecast.policy.actions import action_from_json

        horizons = self._model_horizons()
        if isinstance(horizons, str):
            return self._keep(horizons)
        resp = self.client.recommend(self.request(state, compute, held, horizons))
        if resp is None:
            return self._keep(self.client.last_error or "no answer")
        return Decision(action_from_json(resp.action), reason=resp.reason,
                        predicted_step_s=resp.step_time_s,
                        predicted_step_with_action_s=resp.step_time_with_action_s,
                        migration_s=resp.migration_s)

    def close(self) -> None:
        self.client.close()
