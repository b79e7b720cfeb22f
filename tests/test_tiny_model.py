"""The embedded tiny model loads in transformers, behaves like a Llama 3, and is reproducible."""

from __future__ import annotations

import hashlib
from dataclasses import astuple
from pathlib import Path

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from minipic_server.markers import HSEP_TOKEN, PAD_TOKEN, PDEP_TOKEN, SSEP_TOKEN, pick_marker_ids
from minipic_server.tiny_model import BOS_TOKEN, EOS_TOKEN, LATE_SPECIAL_TOKENS, SPECIAL_TOKENS, make_tiny_model

MARKER_TOKENS = [SSEP_TOKEN, PDEP_TOKEN, PAD_TOKEN, HSEP_TOKEN]  # `MarkerIds` order


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return make_tiny_model(tmp_path_factory.mktemp("tiny"))


@pytest.fixture(scope="module")
def tokenizer(model_dir: Path):
    return AutoTokenizer.from_pretrained(model_dir)


@pytest.fixture(scope="module")
def model(model_dir: Path):
    return AutoModelForCausalLM.from_pretrained(
        model_dir, attn_implementation="eager", dtype=torch.float32
    ).eval()


def _digests(directory: Path) -> dict[str, str]:
    return {p.name: hashlib.sha256(p.read_bytes()).hexdigest() for p in sorted(directory.iterdir())}


def test_files_written(model_dir: Path) -> None:
    assert set(_digests(model_dir)) == {
        "config.json", "generation_config.json", "model.safetensors",
        "tokenizer.json", "tokenizer_config.json",
    }


def test_vocab_matches_embeddings(model, tokenizer) -> None:
    assert model.config.vocab_size == len(tokenizer)
    assert model.get_input_embeddings().weight.shape[0] == len(tokenizer)
    assert model.get_output_embeddings().weight.shape[0] == len(tokenizer)
    assert model.config.bos_token_id == tokenizer.bos_token_id
    assert model.config.eos_token_id == tokenizer.eos_token_id
    assert model.config.pad_token_id == tokenizer.pad_token_id


def test_config_is_llama3_like(model) -> None:
    cfg = model.config
    assert (cfg.num_hidden_layers, cfg.hidden_size, cfg.intermediate_size) == (2, 256, 512)
    assert (cfg.num_attention_heads, cfg.num_key_value_heads, cfg.head_dim) == (4, 2, 64)
    assert cfg.rope_parameters["rope_type"] == "llama3"
    assert cfg.rope_parameters["rope_theta"] == 10000.0
    assert model.dtype == torch.float32


def test_special_tokens_are_single_ids(tokenizer) -> None:
    assert tokenizer.bos_token == BOS_TOKEN
    assert tokenizer.eos_token == EOS_TOKEN
    assert tokenizer.pad_token == PAD_TOKEN
    for token in (*SPECIAL_TOKENS, *LATE_SPECIAL_TOKENS):
        ids = tokenizer.encode(token, add_special_tokens=False)
        assert ids == [tokenizer.convert_tokens_to_ids(token)], token
    markers = pick_marker_ids(tokenizer)
    assert astuple(markers) == tuple(tokenizer.convert_tokens_to_ids(MARKER_TOKENS))


def test_literal_marker_text_is_split_when_asked(tokenizer) -> None:
    """A user's literal marker text must never become a marker id (the client encodes this way)."""
    marker_ids = set(tokenizer.convert_tokens_to_ids(MARKER_TOKENS))
    text = f"a {SSEP_TOKEN} b {PDEP_TOKEN} c {PAD_TOKEN} d {HSEP_TOKEN}"
    ids = tokenizer(text, add_special_tokens=False, split_special_tokens=True).input_ids
    assert not marker_ids & set(ids)
    assert tokenizer.decode(ids) == text


def test_bos_prepended_and_any_text_round_trips(tokenizer) -> None:
    text = "héllo wörld 世界 🙂\ttabs\n\nand 12345"
    ids = tokenizer(text).input_ids
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.bos_token_id not in ids[1:]
    assert tokenizer.decode(ids[1:]) == text


def test_chat_template(tokenizer) -> None:
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}]
    text = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    assert text == (
        "<|begin_of_text|>"
        "<|start_header_id|>system<|end_header_id|>\n\nBe brief.<|eot_id|>"
        "<|start_header_id|>user<|end_header_id|>\n\nhi<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\n"
    )


def test_logits_not_flat_and_reproducible(model, tokenizer) -> None:
    inputs = tokenizer("The quick brown fox jumps over the lazy dog", return_tensors="pt")
    with torch.no_grad():
        first = model(**inputs).logits
        second = model(**inputs).logits
    assert first[0, -1].std() > 0.05
    assert torch.equal(first, second)


def test_build_is_deterministic(model_dir: Path, tmp_path: Path) -> None:
    assert _digests(make_tiny_model(tmp_path / "again")) == _digests(model_dir)


def test_seed_changes_weights_only(model_dir: Path, tmp_path: Path) -> None:
    other = _digests(make_tiny_model(tmp_path / "seed1", seed=1))
    same = _digests(model_dir)
    assert other.pop("model.safetensors") != same.pop("model.safetensors")
    assert other == same
