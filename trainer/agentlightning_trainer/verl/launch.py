# pyright: reportMissingImports=false
# (verl, hydra and omegaconf come with the optional [verl] extra, absent from the main environment pyright checks)
"""``agl train --backend torch|verl --config run.yaml``: the LightningRL algorithm a settings file describes.

The file (JSON, or YAML when omegaconf is installed, as it is with verl) holds :class:`LightningRLConfig` fields;
an optional ``verl`` section holds :class:`VerlSettings` fields::

    steps: 100
    tasks_per_step: 16
    samples_per_task: 8
    lr: 1.0e-6
    max_prompt_tokens: 1024
    max_response_tokens: 512
    policy: {kind: hf, hf_model: Qwen/Qwen2.5-0.5B-Instruct, model_name: policy}
    verl: {n_gpus_per_node: 8, nnodes: 2, ray_address: auto}
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from agentlightning.algorithm import Algorithm
from agentlightning_trainer.config import LightningRLConfig


def load_settings_file(path: Path) -> dict[str, Any]:
    """The mapping in a JSON or YAML settings file."""
    if not path.exists():
        raise ValueError(f"no settings file at {str(path)!r}")
    text = path.read_text(encoding="utf-8")
    if path.suffix in (".yaml", ".yml"):
        try:
            from omegaconf import OmegaConf
        except ImportError as exc:
            raise ValueError(f"{path} is YAML, which needs omegaconf (pip install omegaconf); or write JSON") from exc
        data: Any = OmegaConf.to_container(OmegaConf.create(text), resolve=True)
    else:
        data = json.loads(text)
    if not isinstance(data, dict):
        raise ValueError(f"{path} must hold a mapping of LightningRL settings, not {type(data).__name__}")
    return {str(key): value for key, value in data.items()}


def algorithm_from_cli(backend: str, config_path: Path | None = None) -> Algorithm:
    """LightningRL on ``backend`` ('torch' or 'verl') with the settings of ``config_path`` (defaults otherwise)."""
    if backend not in ("torch", "verl"):
        raise ValueError(f"unknown backend {backend!r}; use 'torch' or 'verl'")
    values = load_settings_file(config_path) if config_path is not None else {}
    verl_values = values.pop("verl", None) or {}
    if verl_values and backend != "verl":
        raise ValueError(f"{config_path} has a 'verl' section but the backend is {backend!r}; pass --backend verl")
    config = LightningRLConfig.model_validate({**values, "backend": backend})
    if backend == "torch":
        from agentlightning_trainer.lightning_rl import LightningRL

        return LightningRL(config)
    from agentlightning_trainer.verl.algorithm import VerlLightningRL
    from agentlightning_trainer.verl.settings import VerlSettings

    return VerlLightningRL(config, verl=VerlSettings.model_validate(verl_values))
