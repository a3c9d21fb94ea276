"""The reward curve: train reward (per step and its EMA) and greedy validation reward, as a PNG."""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from agentlightning_trainer.metrics import StepMetrics


def plot_reward_curve(
    history: Sequence[StepMetrics],
    val_history: Sequence[tuple[int, float]],
    path: Path,
    *,
    title: str,
) -> Path:
    """Write the train and validation reward curves to ``path`` (matplotlib, no display needed).

    ``title`` names the task; it heads the plot and is the PNG's ``Title`` metadata.
    """
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(8, 4.5), dpi=120)
    steps = [m.step for m in history]
    ax.plot(steps, [m.reward_mean for m in history], color="tab:blue", alpha=0.3, label="train reward (step mean)")
    ax.plot(steps, [m.reward_ema for m in history], color="tab:blue", linewidth=2, label="train reward (EMA)")
    if val_history:
        ax.plot(
            [s for s, _ in val_history],
            [v for _, v in val_history],
            color="tab:orange",
            marker="o",
            linewidth=2,
            label="validation reward (greedy)",
        )
    ax.set_xlabel("training step", fontsize=11)
    ax.set_ylabel("mean reward", fontsize=11)
    ax.set_ylim(-0.02, 1.02)
    ax.set_title(title, fontsize=12)
    ax.grid(alpha=0.3)
    ax.legend(loc="lower right", fontsize=10)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, metadata={"Title": title})
    plt.close(fig)
    return path
