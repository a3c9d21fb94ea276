"""``Sequential``: run several algorithms one after another on one store, e.g. prompt (APO) then weights (RL).

Between steps two things are handed over:

* **resources** — every algorithm reads them from the store: APO starts from the latest snapshot's templates and
  publishes its best ones last; LightningRL and SFT publish their ``llm`` over the non-LLM resources of the latest
  snapshot (:func:`agentlightning_trainer.batches.publish_llm`), so RL trains under APO's best prompt;
* **weights** — after :class:`~agentlightning_trainer.sft.SFT`, a :class:`~agentlightning_trainer.LightningRL` with
  the same ``PolicySpec`` starts from the fine-tuned weights: its ``init_weights`` is set to SFT's weights file and
  its policy version continues from SFT's.
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from typing import Any

from agentlightning.algorithm import Algorithm
from agentlightning.store.base import LightningStore

logger = logging.getLogger(__name__)


class Sequential(Algorithm):
    """Runs ``algorithms`` in order against the same store and tasks (see the module docstring)."""

    def __init__(self, algorithms: Sequence[Algorithm]) -> None:
        """Keep the steps (at least one) and check every SFT → LightningRL weights handover now."""
        if not algorithms:
            raise ValueError("Sequential needs at least one algorithm, e.g. Sequential([APO(...), LightningRL(...)])")
        self.algorithms = list(algorithms)
        for previous, algorithm in zip(self.algorithms, self.algorithms[1:], strict=False):
            _check_weights_handover(previous, algorithm)

    async def run(
        self,
        store: LightningStore,
        train_tasks: Sequence[Any] | None = None,
        val_tasks: Sequence[Any] | None = None,
    ) -> None:
        """Run each step to its end before starting the next."""
        previous: Algorithm | None = None
        for index, algorithm in enumerate(self.algorithms):
            if previous is not None:
                _hand_over_weights(previous, algorithm)
            logger.info("Sequential step %d/%d: %s", index + 1, len(self.algorithms), type(algorithm).__name__)
            await algorithm.run(store, train_tasks, val_tasks)
            previous = algorithm


def _check_weights_handover(previous: Algorithm, algorithm: Algorithm) -> None:
    """SFT → LightningRL needs the torch backend, the same policy spec and no other initial weights."""
    from agentlightning_trainer.lightning_rl import LightningRL
    from agentlightning_trainer.sft import SFT

    if not (isinstance(previous, SFT) and isinstance(algorithm, LightningRL)):
        return
    cfg = algorithm.config
    if cfg.backend != "torch":
        raise ValueError("LightningRL after SFT must use backend='torch': SFT fine-tunes the torch policy")
    if cfg.policy != previous.config.policy:
        raise ValueError("LightningRL after SFT needs SFT's PolicySpec (the weights must fit the same model)")
    if cfg.init_weights is not None:
        raise ValueError(
            f"LightningRL after SFT starts from SFT's weights, but init_weights={str(cfg.init_weights)!r} is set; "
            "drop it, or run the two without Sequential"
        )


def _hand_over_weights(previous: Algorithm, algorithm: Algorithm) -> None:
    """SFT → LightningRL: LightningRL starts from SFT's weights file, its policy version continues from SFT's."""
    from agentlightning_trainer.lightning_rl import LightningRL
    from agentlightning_trainer.sft import SFT

    if not (isinstance(previous, SFT) and isinstance(algorithm, LightningRL)):
        return
    if previous.weights_path is None:
        raise RuntimeError("SFT finished without writing its weights; it must run before LightningRL starts")
    algorithm.config = algorithm.config.model_copy(update={"init_weights": previous.weights_path})
    algorithm.version = previous.version
    logger.info(
        "Sequential: SFT weights (version %d) handed to LightningRL from %s", previous.version, previous.weights_path
    )
