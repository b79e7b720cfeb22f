"""One rule for marker tokens: picked automatically, and explicit ids refused at start-up when text can produce them."""

from __future__ import annotations

from pathlib import Path

import pytest
from tokenizers import Tokenizer, models, pre_tokenizers
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from minipic_protocol import MarkerIds
from minipic_server.config import MiniPICConfigError
from minipic_server.markers import HSEP_TOKEN, MarkerRule, pick_marker_ids

WORDS = ["hello", "world", "}", "<x>"]
CHATML = (
    "{% for m in messages %}{{ '<|im_start|>' + m['role'] + '\\n' + m['content'] + '<|im_end|>\\n' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
LLAMA3_TEMPLATE = (
    "{{ bos_token }}{% for m in messages %}{{ '<|start_header_id|>' + m['role'] + '<|end_header_id|>\\n\\n'"
    " + m['content'] + '<|eot_id|>' }}{% endfor %}"
    "{% if add_generation_prompt %}{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}{% endif %}"
)


def word_tokenizer(specials: list[str], template: str | None, **roles: str) -> PreTrainedTokenizerFast:
    """A word-level tokenizer: `WORDS` (ids 0-3), "[UNK]" (4), then the special tokens (5, ...)."""
    vocab = {token: i for i, token in enumerate([*WORDS, "[UNK]"])}
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    backend.add_special_tokens(specials)
    return PreTrainedTokenizerFast(tokenizer_object=backend, chat_template=template, unk_token="[UNK]", **roles)


@pytest.fixture(scope="module")
def chatml() -> PreTrainedTokenizerFast:
    """Like SmolLM2: ChatML roles, then special tokens that the chat template never uses (8-11)."""
    specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<repo_name>", "<jupyter_output>",
                "<jupyter_script>", "<empty_output>"]
    return word_tokenizer(specials, CHATML, bos_token="<|endoftext|>", eos_token="<|im_end|>")


def test_tiny_model_keeps_its_dedicated_markers(tiny_model_dir: Path) -> None:
    tokenizer = AutoTokenizer.from_pretrained(tiny_model_dir)
    hsep = tokenizer.convert_tokens_to_ids(HSEP_TOKEN)
    assert hsep == 2048  # after every learned token: no earlier id moved
    assert pick_marker_ids(tokenizer) == MarkerIds(5, 6, 7, hsep)


def llama3(reserved: int) -> PreTrainedTokenizerFast:
    specials = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>",
                *(f"<|reserved_special_token_{i}|>" for i in range(reserved))]
    return word_tokenizer(specials, LLAMA3_TEMPLATE, bos_token="<|begin_of_text|>", eos_token="<|end_of_text|>")


def test_llama3_keeps_reserved_tokens_10_to_12_and_takes_13_for_hsep() -> None:
    tokenizer = llama3(16)
    assert pick_marker_ids(tokenizer) == MarkerIds(20, 21, 22, 23)  # reserved 10, 11, 12, 13
    assert MarkerRule(tokenizer).valid_ids() == list(range(10, 26))  # reserved 0-15
    # Without reserved 13, HSep is the last unused one the others left.
    assert pick_marker_ids(llama3(13)) == MarkerIds(20, 21, 22, 19)


def test_other_tokenizers_get_their_last_three_unused_special_tokens_then_hsep(chatml) -> None:
    rule = MarkerRule(chatml)
    assert rule.valid_ids() == [8, 9, 10, 11]
    assert rule.pick() == MarkerIds(9, 10, 11, 8)


def test_a_tokenizer_with_three_unused_special_tokens_serves_without_hsep() -> None:
    assert pick_marker_ids(word_tokenizer(["<a>", "<b>", "<c>"], None)) == MarkerIds(5, 6, 7, None)


def test_hsep_given_alone_is_checked_like_the_others(chatml) -> None:
    rule = MarkerRule(chatml)
    rule.check(MarkerIds(9, 10, 11, 8))
    with pytest.raises(MiniPICConfigError, match="^hsep_token_id=6 cannot be a MiniPIC marker: the chat template"):
        rule.check(MarkerIds(9, 10, 11, 6))
    assert rule.with_hsep(MarkerIds(8, 9, 10)) == MarkerIds(8, 9, 10, 11)


@pytest.mark.parametrize(
    ("token_id", "reason"),
    [
        (2, "'}' is an ordinary token, which text produces"),
        (4, "'\\[UNK\\]' is the unknown token"),
        (5, "'<\\|endoftext\\|>' is inserted into prompts"),  # BOS of this tokenizer
        (6, "the chat template emits '<\\|im_start\\|>'"),
        (7, "'<\\|im_end\\|>' ends generation"),
        (99, "it is outside the tokenizer's vocabulary \\(size 12\\)"),
    ],
)
def test_explicit_ids_that_text_or_the_template_produce_are_refused(chatml, token_id: int, reason: str) -> None:
    rule = MarkerRule(chatml)
    with pytest.raises(MiniPICConfigError, match=f"^pdep_token_id={token_id} cannot be a MiniPIC marker: {reason}"):
        rule.check(MarkerIds(9, token_id, 11))
    rule.check(MarkerIds(9, 10, 11))


def test_a_special_token_that_text_also_spells_is_refused() -> None:
    """'<x>' is a word of the vocabulary and a special token: text encoded as text still yields its id."""
    tokenizer = word_tokenizer(["<a>", "<b>", "<c>"], None)
    tokenizer.add_special_tokens({"additional_special_tokens": ["<x>"]})
    x = tokenizer.convert_tokens_to_ids("<x>")
    assert tokenizer("<x>", add_special_tokens=False, split_special_tokens=True)["input_ids"] == [x]
    assert MarkerRule(tokenizer).problem(x) == "encoding the text '<x>' produces it"
    assert MarkerRule(tokenizer).pick() == MarkerIds(5, 6, 7, None)


def test_too_few_unused_special_tokens_names_the_flags() -> None:
    with pytest.raises(MiniPICConfigError, match="2 unused special tokens \\(5, 6\\), 3 are needed.*--ssep-token-id"):
        pick_marker_ids(word_tokenizer(["<a>", "<b>"], None))
