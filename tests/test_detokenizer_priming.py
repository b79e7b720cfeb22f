"""The detokenizer primed from the prompt's tail writes what vLLM's whole-prompt priming writes.

vLLM's own `FastIncrementalDetokenizer`, once as vLLM builds it and once with MiniPIC's
tail priming (`minipic_server.detokenizer_priming`), over the same prompts and generated
tokens, on three real tokenizers: the tiny model's byte-level BPE, SmolLM2's, and a
SentencePiece-style one (metaspace, byte fallback, a leading-space strip) trained here.
Generated tokens are random ids, so characters split over byte tokens, special tokens and
word pieces joining the prompt's last word all occur.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import tokenizers
from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, trainers
from vllm.sampling_params import SamplingParams
from vllm.tokenizers import get_tokenizer
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer

from minipic_server import detokenizer_priming
from minipic_server.detokenizer_priming import TAIL_TOKENS, prompt_tail, wrap_fast_detokenizer_init
from minipic_server.model_fetch import fetch_model
from minipic_server.tiny_model import _corpus

TEXT = [
    "Die Brücke über den Fluss wurde 1932 eröffnet; sie trägt eine Bahnlinie.",
    "東京の天気は晴れです。明日は雨が降るでしょう。",
    "Café, naïve, façade — and an emoji 🚂🌉 between words.",
    "The Harbour Bridge in Port Elin was opened in 1932 and spans 503 metres.",
]


class TailPrimed(FastIncrementalDetokenizer):
    __init__ = wrap_fast_detokenizer_init(FastIncrementalDetokenizer.__init__)


def sentencepiece_style(directory: Path) -> Path:
    """A Llama-2-style tokenizer: metaspace words, byte fallback, one leading space stripped."""
    tok = Tokenizer(models.BPE(unk_token="<unk>", byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend("▁"), normalizers.Replace(" ", "▁")])
    tok.pre_tokenizer = pre_tokenizers.Split("▁", "merged_with_next")
    tok.decoder = decoders.Sequence([
        decoders.Replace("▁", " "), decoders.ByteFallback(), decoders.Fuse(), decoders.Strip(" ", 1, 0),
    ])
    byte_tokens = [f"<0x{b:02X}>" for b in range(256)]
    trainer = trainers.BpeTrainer(vocab_size=1200, special_tokens=["<unk>", "<s>", "</s>", *byte_tokens],
                                  show_progress=False)
    tok.train_from_iterator(_corpus(random.Random(1), lines=800) + TEXT[:1] * 20, trainer=trainer)
    directory.mkdir(parents=True, exist_ok=True)
    tok.save(str(directory / "tokenizer.json"))
    (directory / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": "PreTrainedTokenizerFast"}))
    (directory / "config.json").write_text(json.dumps({"model_type": "llama"}))
    return directory


@pytest.fixture(scope="module", params=["tiny", "smollm2", "sentencepiece"])
def tokenizer(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory):
    if request.param == "tiny":
        directory = request.getfixturevalue("tiny_model_dir")
    elif request.param == "smollm2":
        directory = fetch_model("smollm2")
    else:
        directory = sentencepiece_style(tmp_path_factory.mktemp("sp"))
    return get_tokenizer(str(directory))


@pytest.fixture(autouse=True)
def _active(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(detokenizer_priming, "_active", True)


def request_for(prompt: list[int], params: SamplingParams) -> EngineCoreRequest:
    return EngineCoreRequest(request_id="r", prompt_token_ids=prompt, mm_features=None, sampling_params=params,
                             pooling_params=None, arrival_time=0.0, lora_request=None, cache_salt=None,
                             data_parallel_rank=None)


def generated_text(detokenizer_class: type, tokenizer, prompt: list[int], generated: list[int], skip: bool) -> str:
    params = SamplingParams(max_tokens=len(generated), skip_special_tokens=skip)
    detokenizer = detokenizer_class(tokenizer, request_for(prompt, params))
    text = ""
    for token in generated:
        detokenizer.update([token], False)
        text += detokenizer.get_next_output_text(False, True)
    return text + detokenizer.get_next_output_text(True, True)


def test_tail_priming_writes_what_whole_prompt_priming_writes(tokenizer) -> None:
    rng = random.Random(0)
    vocab = len(tokenizer)
    tails = 0
    for case in range(150):
        text = " ".join(rng.choice(TEXT) for _ in range(rng.randint(2, 12)))
        prompt = tokenizer.encode(text, add_special_tokens=False)
        if case % 5 == 0:  # a prompt of arbitrary ids: its tail may start or end inside a character
            prompt = [rng.randrange(vocab) for _ in range(rng.randint(1, 120))]
        generated = [rng.randrange(vocab) for _ in range(rng.randint(1, 12))]
        skip = bool(case % 2)
        tails += prompt_tail(tokenizer._tokenizer, prompt, skip) is not None
        expected = generated_text(FastIncrementalDetokenizer, tokenizer, prompt, generated, skip)
        assert generated_text(TailPrimed, tokenizer, prompt, generated, skip) == expected, (prompt, generated)
    assert tails > 60  # most prompts took the tail


def test_a_short_or_broken_tail_keeps_vllms_priming(tokenizer) -> None:
    words = tokenizer.encode(" ".join(TEXT), add_special_tokens=False)
    assert prompt_tail(tokenizer._tokenizer, words[:TAIL_TOKENS], True) is None  # short: nothing to gain
    assert prompt_tail(tokenizer._tokenizer, words, True) == words[-TAIL_TOKENS:]
    emoji = tokenizer.encode("🚂", add_special_tokens=False)
    assert len(emoji) > 1
    cut = words + emoji[:-1]  # the prompt ends inside the character
    assert prompt_tail(tokenizer._tokenizer, cut, False) is None


@pytest.mark.parametrize("active", [True, False])
def test_primed_from_the_tail_only_when_pic_is_active(tokenizer, monkeypatch: pytest.MonkeyPatch, active) -> None:
    monkeypatch.setattr(detokenizer_priming, "_active", active)
    primed: list[int] = []
    stream = tokenizers.decoders.DecodeStream

    def recording(ids=None, **kwargs):
        primed.append(len(ids or ()))
        return stream(ids=ids, **kwargs)

    monkeypatch.setattr(tokenizers.decoders, "DecodeStream", recording)
    prompt = tokenizer.encode(" ".join(TEXT), add_special_tokens=False)
    TailPrimed(tokenizer, request_for(prompt, SamplingParams(max_tokens=1)))
    assert primed == ([len(prompt), TAIL_TOKENS] if active else [len(prompt)])
