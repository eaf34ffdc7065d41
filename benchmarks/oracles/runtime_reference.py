"""Single-process reference training: the math a pipeline run must reproduce exactly.

Same layer initialisation, same batches, the same micro-batch split (``tensor_split`` along
dim 0), per-micro-batch mean losses back-propagated one after another, gradients divided by
the micro-batch count (the schedules' ``scale_grads``), then one optimizer step.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

from bubblecast.runtime.networks import LayerModel, make_optimizer
from bubblecast.runtime.train_config import TrainConfig


class Reference:
    """The whole model in one process; ``run`` mirrors :class:`Trainer.train_step`."""

    def __init__(self, config: TrainConfig, model: LayerModel | None = None) -> None:
        self.config = config
        self.source = model or LayerModel.example(config.model, config.seed)
        self.layers = [self.source.build(i) for i in range(self.source.layers)]
        self.model = nn.Sequential(*self.layers)
        c = config
        self.optimizer = make_optimizer(c.optimizer, list(self.model.parameters()), c.lr,
                                        c.momentum, c.weight_decay)
        self.loss = self.source.loss
        self.step = 0

    def train_step(self, microbatches: int | None = None) -> float:
        c = self.config
        m = microbatches or c.microbatches
        x, y = self.source.batch(self.step, c.batch_size)
        losses = []
        for xm, ym in zip(x.tensor_split(m), y.tensor_split(m), strict=True):
            loss = self.loss(self.model(xm), ym)
            loss.backward()
            losses.append(float(loss.item()))
        for p in self.model.parameters():
            if p.grad is not None:
                p.grad.div_(m)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        self.step += 1
        return sum(losses) / len(losses)

    def run(self, steps: int, microbatches: Callable[[int], int] | None = None) -> list[float]:
        """Losses of ``steps`` steps; ``microbatches(step)`` gives each step's count."""
        return [self.train_step(microbatches(self.step) if microbatches else None)
                for _ in range(steps)]

    def layer_state(self) -> dict[int, dict[str, torch.Tensor]]:
        return {i: {k: v.detach().clone() for k, v in layer.state_dict().items()}
                for i, layer in enumerate(self.layers)}
