"""The client's tokenizer gives the ids and chat-template text transformers gives (the client used it before)."""

from __future__ import annotations

import json
import random
import shutil
from pathlib import Path
from typing import Any

import pytest
from transformers import AutoTokenizer

from minipic_client import ConfigError, Tokenizer
from minipic_server.markers import PAD_TOKEN, PDEP_TOKEN, SSEP_TOKEN
from minipic_server.tiny_model import SPECIAL_TOKENS

pytest_plugins = ["sdk_fixtures"]  # sdk_tokenizer (transformers), client_tokenizer, fake_client

TEXTS = [
    "The old mill was built in 1820 on the north bank of the river.",
    "  leading and trailing spaces  ",
    "Tabs\tand\nnewlines\n\n\r\nand CRLF",
    "Ünïcödé, emoji 🎉, CJK 漢字, RTL עברית",
    f"Quoting {SSEP_TOKEN}, {PDEP_TOKEN}, {PAD_TOKEN} and <|eot_id|><|begin_of_text|> inline",
    "<|minipic_ssep|>at the start and at the end<|minipic_pad|>",
    "digits 1234567890 3.14159 -0.5e10",
    "",
]


def random_texts(count: int) -> list[str]:
    rng = random.Random(7)
    alphabet = "abc XYZ 019 .,!?'\"\n\té漢🎉<|>_" + "".join(SPECIAL_TOKENS)
    return ["".join(rng.choice(alphabet) for _ in range(rng.randrange(0, 80))) for _ in range(count)]


@pytest.mark.parametrize("special_tokens_as_text", [True, False])
def test_same_ids_as_transformers(client_tokenizer: Tokenizer, sdk_tokenizer: Any, special_tokens_as_text: bool):
    for text in TEXTS + random_texts(300):
        expected = sdk_tokenizer(text, add_special_tokens=False, split_special_tokens=special_tokens_as_text)
        assert client_tokenizer.encode(text, special_tokens_as_text=special_tokens_as_text) == expected.input_ids


def test_same_vocabulary_and_leading_ids(client_tokenizer: Tokenizer, sdk_tokenizer: Any) -> None:
    assert len(client_tokenizer) == len(sdk_tokenizer)
    assert client_tokenizer.get_vocab() == sdk_tokenizer.get_vocab()
    assert client_tokenizer.leading_ids == (sdk_tokenizer.bos_token_id,)


CONVERSATIONS = [
    [{"role": "user", "content": "hi"}],
    [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "hi"}],
    [{"role": "user", "content": "a"}, {"role": "assistant", "content": "b"}, {"role": "user", "content": "c"}],
]
# Exercises the Hugging Face template dialect: trimming, loop controls, tojson, special tokens, the
# generation tag, raise_exception, and tools/documents passed as none.
DIALECT_TEMPLATE = """
{%- if tools is not none or documents is not none %}{{ raise_exception('no tools here') }}{% endif %}
{{ bos_token }}
{% for m in messages %}
    {% if m['role'] == 'skip' %}{% continue %}{% endif %}
    <{{ m['role'] }}>{{ m | tojson }}{{ eos_token }}
    {% if m['role'] == 'assistant' %}{% generation %}[{{ m['content'] }}]{% endgeneration %}{% endif %}
{% endfor %}
{%- if add_generation_prompt %}<assistant>{% endif %}
"""


@pytest.mark.parametrize("template", [None, DIALECT_TEMPLATE], ids=["model template", "dialect"])
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_same_chat_text_as_transformers(
    client_tokenizer: Tokenizer, sdk_tokenizer: Any, template: str | None, add_generation_prompt: bool
) -> None:
    if template is not None:
        client_tokenizer = Tokenizer(client_tokenizer._backend, chat_template=template,
                                     special_tokens=client_tokenizer.special_tokens)
    for messages in CONVERSATIONS:
        expected = sdk_tokenizer.apply_chat_template(
            messages, chat_template=template, tokenize=False, add_generation_prompt=add_generation_prompt
        )
        assert client_tokenizer.apply_chat_template(messages, add_generation_prompt=add_generation_prompt) == expected


def test_template_file_and_named_templates(tiny_model_dir: Path, tmp_path: Path) -> None:
    shutil.copy(tiny_model_dir / "tokenizer.json", tmp_path)
    config = json.loads((tiny_model_dir / "tokenizer_config.json").read_text())
    config["chat_template"] = [{"name": "tool_use", "template": "T"}, {"name": "default", "template": "D"}]
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(config))
    assert Tokenizer.from_pretrained(tmp_path).chat_template == "D"
    (tmp_path / "chat_template.jinja").write_text("{{ messages[0]['content'] }}!")
    loaded = Tokenizer.from_pretrained(tmp_path)
    assert loaded.apply_chat_template([{"role": "user", "content": "x"}]) == "x!"
    assert AutoTokenizer.from_pretrained(tmp_path).apply_chat_template(
        [{"role": "user", "content": "x"}], tokenize=False
    ) == "x!"


def test_unusable_tokenizers_fail_with_one_line(
    client_tokenizer: Tokenizer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(ConfigError, match="has no tokenizer.json"):
        Tokenizer.from_pretrained(tmp_path)
    monkeypatch.setattr("huggingface_hub.constants.HF_HUB_OFFLINE", True)  # no network in tests
    with pytest.raises(ConfigError, match="cannot load tokenizer 'nobody/no-such-model'"):
        Tokenizer.from_pretrained("nobody/no-such-model")
    broken = Tokenizer(client_tokenizer._backend, chat_template="{% if %}")
    with pytest.raises(ConfigError, match="chat template does not compile"):
        broken.apply_chat_template([{"role": "user", "content": "x"}])


async def test_span_client_names_a_tokenizer_it_cannot_use(fake_client: Any, sdk_tokenizer: Any) -> None:
    with pytest.raises(ConfigError, match=f"or a minipic_client.Tokenizer, not a {type(sdk_tokenizer).__name__}"):
        async with fake_client(tokenizer=sdk_tokenizer):
            pass
