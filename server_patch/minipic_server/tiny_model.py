"""The embedded default model: a tiny random-weight Llama 3 look-alike, built offline.

It lets MiniPIC's server, tests and benchmarks run with nothing downloaded, while
exercising the same code paths as a real Llama 3 (GQA, llama3 RoPE scaling,
byte-level BPE, chat template, BOS prepending). Everything is deterministic, so
two builds are byte-identical and cache keys and logits are reproducible.
"""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import torch
from safetensors.torch import save_file
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers

from minipic_server.markers import HSEP_TOKEN, PAD_TOKEN, PDEP_TOKEN, SSEP_TOKEN

BOS_TOKEN = "<|begin_of_text|>"
EOS_TOKEN = "<|end_of_text|>"
EOT_TOKEN = "<|eot_id|>"
SPECIAL_TOKENS = (
    BOS_TOKEN,
    EOS_TOKEN,
    "<|start_header_id|>",
    "<|end_header_id|>",
    EOT_TOKEN,
    SSEP_TOKEN,
    PDEP_TOKEN,
    PAD_TOKEN,
)
VOCAB_SIZE = 2048
# Added after training, so it takes the id after every learned token and no earlier id
# moves (HSep came after the other markers).
LATE_SPECIAL_TOKENS = (HSEP_TOKEN,)
MAX_LEN = 4096

CHAT_TEMPLATE = (
    "{{ bos_token }}"
    "{% for message in messages %}"
    "{{ '<|start_header_id|>' + message['role'] + '<|end_header_id|>\\n\\n'"
    " + message['content'] + '<|eot_id|>' }}"
    "{% endfor %}"
    "{% if add_generation_prompt %}"
    "{{ '<|start_header_id|>assistant<|end_header_id|>\\n\\n' }}"
    "{% endif %}"
)

# Common English words; the corpus below mixes them so BPE learns whole words,
# leading-space variants, capitals, digits and punctuation.
_WORDS = """
the of and to in is it you that he was for on are with as his they be at one have
this from or had by word but what some we can out other were all there when up use
your how said an each she which do their time if will way about many then them
write would like so these her long make thing see him two has look more day could go
come did number sound no most people my over know water than call first who may down
side been now find any new work part take get place made live where after back little
only round man year came show every good me give our under name very through just form
sentence great think say help low line differ turn cause much mean before move right
boy old too same tell does set three want air well also play small end put home read
hand port large spell add even land here must big high such follow act why ask men
change went light kind off need house picture try us again animal point mother world
near build self earth father head stand own page should country found answer school
grow study still learn plant cover food sun four between state keep eye never last let
thought city tree cross farm hard start might story saw far sea draw left late run
while press close night real life few north open seem together next white children
begin got walk example ease paper group always music those both mark often letter
until mile river car feet care second book carry took science eat room friend began
idea fish mountain stop once base hear horse cut sure watch color face wood main enough
plain girl usual young ready above ever red list though feel talk bird soon body dog
family direct pose leave song measure door product black short numeral class wind
question happen complete ship area half rock order fire south problem piece told knew
pass since top whole king space heard best hour better true during hundred five
remember step early hold west ground interest reach fast verb sing listen six table
travel less morning ten simple several vowel toward war lay against pattern slow
center love person money serve appear road map rain rule govern pull cold notice voice
unit power town fine certain fly fall lead cry dark machine note wait plan figure star
box noun field rest correct able pound done beauty drive stood contain front teach
week final gave green quick develop ocean warm free minute strong special mind behind
clear tail produce fact street inch multiply nothing course stay wheel full force blue
object decide surface deep moon island foot system busy test record boat common gold
possible plane stead dry wonder laugh thousand ago ran check game shape equate hot miss
brought heat snow tire bring yes distant fill east paint language among cache query
document model token server context prefix position layer attention user assistant system
""".split()
_PUNCTUATION = (".", ",", "?", "!", ":", ";")


def _corpus(rng: random.Random, lines: int = 3000) -> list[str]:
    """Deterministic pseudo-English sentences with numbers: enough for ~1800 BPE merges."""
    out = []
    for _ in range(lines):
        words = rng.choices(_WORDS, k=rng.randint(4, 16))
        words[0] = words[0].capitalize()
        if rng.random() < 0.3:
            words.insert(rng.randrange(len(words)), str(rng.randint(0, 2025)))
        out.append(" ".join(words) + rng.choice(_PUNCTUATION))
    return out


def build_tokenizer() -> Tokenizer:
    """Byte-level BPE (so any text encodes) with Llama 3 style special tokens and BOS."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=VOCAB_SIZE,
        special_tokens=list(SPECIAL_TOKENS),
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(_corpus(random.Random(0)), trainer=trainer)
    tok.add_special_tokens(list(LATE_SPECIAL_TOKENS))
    bos_id = tok.token_to_id(BOS_TOKEN)
    tok.post_processor = processors.Sequence([
        processors.ByteLevel(trim_offsets=False),
        processors.TemplateProcessing(
            single=f"{BOS_TOKEN} $A",
            pair=f"{BOS_TOKEN} $A {BOS_TOKEN}:1 $B:1",
            special_tokens=[(BOS_TOKEN, bos_id)],
        ),
    ])
    return tok


def _config(tok: Tokenizer) -> dict:
    """Llama 3 style config, in the legacy rope keys every transformers/vLLM version reads."""
    return {
        "architectures": ["LlamaForCausalLM"],
        "model_type": "llama",
        "vocab_size": tok.get_vocab_size(),
        "hidden_size": 256,
        "intermediate_size": 512,
        "num_hidden_layers": 2,
        "num_attention_heads": 4,
        "num_key_value_heads": 2,
        "head_dim": 64,
        "hidden_act": "silu",
        "max_position_embeddings": MAX_LEN,
        "rope_theta": 10000.0,
        "rope_scaling": {
            "rope_type": "llama3",
            "factor": 4.0,
            "low_freq_factor": 1.0,
            "high_freq_factor": 4.0,
            "original_max_position_embeddings": 1024,
        },
        "rms_norm_eps": 1e-5,
        "attention_bias": False,
        "mlp_bias": False,
        "tie_word_embeddings": False,
        "initializer_range": 0.02,
        "torch_dtype": "float32",
        "dtype": "float32",
        "bos_token_id": tok.token_to_id(BOS_TOKEN),
        "eos_token_id": tok.token_to_id(EOS_TOKEN),
        "pad_token_id": tok.token_to_id(PAD_TOKEN),
    }


def _qwen2_config(tok: Tokenizer) -> dict:
    """A Qwen2 look-alike on the same tokenizer: biased q/k/v projections, 8 query heads over 2
    KV heads of 32 lanes, RoPE base 1e6 without scaling, a tied output head: the other shape
    the guards accept."""
    llama = _config(tok)
    cfg = {key: llama[key] for key in (
        "vocab_size", "hidden_size", "intermediate_size", "num_hidden_layers", "hidden_act",
        "max_position_embeddings", "initializer_range", "torch_dtype", "dtype",
        "bos_token_id", "eos_token_id", "pad_token_id")}  # fmt: skip
    return {
        **cfg,
        "architectures": ["Qwen2ForCausalLM"],
        "model_type": "qwen2",
        "num_attention_heads": 8,
        "num_key_value_heads": 2,
        "head_dim": 32,
        "rope_theta": 1000000.0,
        "rms_norm_eps": 1e-6,
        "use_sliding_window": False,
        "sliding_window": None,
        "max_window_layers": cfg["num_hidden_layers"],
        "tie_word_embeddings": True,  # as in Qwen2's small models: the output head is the input embedding
    }


ARCHITECTURES = {"llama": _config, "qwen2": _qwen2_config}


def _weights(cfg: dict, seed: int) -> dict[str, torch.Tensor]:
    """Seeded N(0, 0.02) matrices (and q/k/v biases for Qwen2) and unit RMSNorm gains, under
    Hugging Face names."""
    gen = torch.Generator().manual_seed(seed)
    hidden, inter, head_dim = cfg["hidden_size"], cfg["intermediate_size"], cfg["head_dim"]
    q_dim = cfg["num_attention_heads"] * head_dim
    kv_dim = cfg["num_key_value_heads"] * head_dim

    def normal(rows: int, cols: int) -> torch.Tensor:
        return torch.randn(rows, cols, generator=gen) * cfg["initializer_range"]

    w = {"model.embed_tokens.weight": normal(cfg["vocab_size"], hidden)}
    for i in range(cfg["num_hidden_layers"]):
        p = f"model.layers.{i}."
        w[p + "self_attn.q_proj.weight"] = normal(q_dim, hidden)
        w[p + "self_attn.k_proj.weight"] = normal(kv_dim, hidden)
        w[p + "self_attn.v_proj.weight"] = normal(kv_dim, hidden)
        w[p + "self_attn.o_proj.weight"] = normal(hidden, q_dim)
        if cfg["model_type"] == "qwen2":
            for name, dim in (("q", q_dim), ("k", kv_dim), ("v", kv_dim)):
                w[p + f"self_attn.{name}_proj.bias"] = normal(1, dim)[0]
        w[p + "mlp.gate_proj.weight"] = normal(inter, hidden)
        w[p + "mlp.up_proj.weight"] = normal(inter, hidden)
        w[p + "mlp.down_proj.weight"] = normal(hidden, inter)
        w[p + "input_layernorm.weight"] = torch.ones(hidden)
        w[p + "post_attention_layernorm.weight"] = torch.ones(hidden)
    w["model.norm.weight"] = torch.ones(hidden)
    if not cfg["tie_word_embeddings"]:
        w["lm_head.weight"] = normal(cfg["vocab_size"], hidden)
    return w


def _write_json(path: Path, obj: dict) -> None:
    path.write_text(json.dumps(obj, indent=2, sort_keys=True) + "\n", encoding="utf-8")


def make_tiny_model(directory: str | os.PathLike, *, seed: int = 0, architecture: str = "llama") -> Path:
    """Write the tiny model (config, weights, tokenizer) into `directory`; return its path.

    `seed` only changes the weights: the tokenizer is the same for every seed.
    `architecture`: one of `ARCHITECTURES` (Llama 3 by default).
    """
    out = Path(directory)
    out.mkdir(parents=True, exist_ok=True)
    tok = build_tokenizer()
    cfg = ARCHITECTURES[architecture](tok)

    tok.save(str(out / "tokenizer.json"))
    _write_json(out / "tokenizer_config.json", {
        "tokenizer_class": "PreTrainedTokenizerFast",
        "bos_token": BOS_TOKEN,
        "eos_token": EOS_TOKEN,
        "pad_token": PAD_TOKEN,
        "model_max_length": MAX_LEN,
        "clean_up_tokenization_spaces": False,
        "chat_template": CHAT_TEMPLATE,
    })
    _write_json(out / "config.json", cfg)
    # Like Llama 3 Instruct, a turn's <|eot_id|> also ends generation.
    _write_json(out / "generation_config.json", {
        "bos_token_id": cfg["bos_token_id"],
        "eos_token_id": [cfg["eos_token_id"], tok.token_to_id(EOT_TOKEN)],
        "pad_token_id": cfg["pad_token_id"],
    })
    save_file(_weights(cfg, seed), str(out / "model.safetensors"), metadata={"format": "pt"})
    return out
