"""Try a visibility rule before building it: layouts answered in transformers with an explicit mask.

The served harness (`accuracy.py`) measures what MiniPIC computes; this measures what a rule
*would* give, so an idea costs minutes on the CPU instead of kernel work. Each question's
prompt is laid out by the SDK exactly as `accuracy.py` sends it (token ids from a CPU
`minipic serve`'s markers and chat template), then answered greedily by Hugging Face
transformers (fp32, eager attention) under MiniPIC's rule (`minipic_protocol.visible`: one
forward pass computes what the server computes with every span cached or not) plus the
variant's changes. A variant is ``LAYOUT[+CHANGE...]``:

- ``LAYOUT``: ``full`` (the plain prompt), ``block``, ``refreshed`` (`RefreshedHeads`),
  ``default`` (the SDK's default until 2026-12-07: the first passage as text, then every passage
  as refreshed heads), ``pdep`` (every passage after a PDep: full attention plus markers and
  padding), or any name ``--layout`` takes (`prompt.TECHNIQUES`);
- ``+hide-pdep``: a PDep marker's key is seen by no other token;
- ``+hide-spans``: an SSep/HSep marker's key is seen only by its own span;
- ``+hide-pads``: a pad's key is seen by no other token;
- ``+pad=ID``: pads are token ``ID`` (an ordinary token) instead of the server's pad marker;
- ``+markers=ID``: SSep, PDep and HSep are embedded as token ``ID`` (the rule still reads them);
- ``+span-bias=B``: ``B`` added to the attention logits of every key inside a span, as seen from
  rows outside every span (APE's scaling of parallel contexts: their softmax weights times e^B);
  what ``minipic serve --span-bias B`` computes;
- ``+first-span-bias=B``: the same for the prompt's first span only;
- ``+span-temp=T``: the attention logits of every key inside a span, as seen from rows outside
  every span, divided by ``T`` (APE's attention temperature: below 1 sharpens what those rows
  read from passages computed apart);
- ``+compact``: the pads and the PDep markers are seen by no other token (``+hide-pdep+hide-pads``)
  *and* take no position: every token the question sees sits right after the one before it, as in
  the plain prompt (each span keeps its own spacing, placed so that its first visible token follows
  what precedes it); what a final prompt would read as plain text if the server dropped them;
- ``+span-sees-prefix``: every span's rows also see the prompt's prefix (everything before its
  first marker block: the system turn and the start of the user turn), as APE computes parallel
  contexts after a shared prefix;
- ``+blend=R``: CacheBlend's selective recompute (`accuracy_blend`): the layout's pass is the
  cache, and the share R of span tokens whose values at layer 1 moved most is recomputed in
  context with every token outside spans; ``+blend-random=R`` draws those tokens at random.

    flock /tmp/minipic-test-server.lock .venv/bin/python benchmarks/accuracy_emulation.py \\
        --passages ../shared/data/2wiki_passages.json --questions 150 \\
        --variants full refreshed refreshed+hide-pdep+hide-pads refreshed+pad=198 \\
        --out benchmarks/results/accuracy-emulation-smollm2-cpu.json
"""

from __future__ import annotations

import argparse
import asyncio
import json
import random
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from accuracy_blend import Blend, blended_answer
from transformers import AttentionInterface, AutoModelForCausalLM, AutoTokenizer
from transformers.models.llama.modeling_llama import repeat_kv

from minipic_client import BlockAttention, Epic, RagRequest, RefreshedHeads, SpanClient, Strategy, Tokenizer
from minipic_client.prompt import TECHNIQUES, Technique
from minipic_kernels.block_kinds import weighed_by_span_bias
from minipic_protocol.blocks import hidden_of_prompt, window_starts_of_prompt
from minipic_protocol.compact import compact_positions_of_prompt, unread_of_prompt
from minipic_protocol.info import ServerInfo
from minipic_server.launch import local_server

from accuracy_families import ORDER_HELP, ORDERS, Corpus, Question, build_family, extract_facts, is_correct
from accuracy_layouts import SYSTEM
from accuracy_stats import versus, wilson
from provenance import provenance

BLOCK_SIZE = 16
SERVER_ARGS = ["--dtype", "float32", "--block-size", str(BLOCK_SIZE), "--max-model-len", "4096", "--enforce-eager"]
# On a GPU the layout server takes a fixed KV cache and checks for only a small share of the GPU
# free at start (vLLM checks --gpu-memory-utilization even with a fixed cache: at its default 0.92,
# 5 of 6 emulations starting side by side failed), so several share one device.
GPU_SERVER_ARGS = ["--kv-cache-memory-bytes", str(512 << 20), "--gpu-memory-utilization", "0.2"]
CHANGES = ("hide-pdep", "hide-spans", "hide-pads", "pad=", "markers=", "span-bias=", "first-span-bias=",
           "span-temp=", "compact", "span-sees-prefix", "blend=", "blend-random=")
TEMPERED = "minipic_tempered"
LAYOUTS = ("full", "block", "refreshed", "default", "pdep")
DEFAULT_TECHNIQUE = TECHNIQUES["lead-text-repeat-refreshed-heads"]  # `SpanClient`'s default until 2026-12-07


def techniques(longest_passage: int, block_size: int) -> dict[str, Technique | None]:
    return {**TECHNIQUES, "full": None, "block": BlockAttention(), "refreshed": RefreshedHeads(),
            "default": DEFAULT_TECHNIQUE, "pdep": Epic(k=longest_passage // block_size + 1)}  # fmt: skip


def parse_variant(variant: str) -> tuple[str, list[str]]:
    layout, *changes = variant.split("+")
    unknown = [c for c in changes if not c.startswith(CHANGES)]
    if (layout not in LAYOUTS and layout not in TECHNIQUES) or unknown:
        raise SystemExit(f"variant {variant!r}: LAYOUT is {'|'.join(LAYOUTS)} or a --layout name, "
                         f"changes {', '.join(CHANGES)}")  # fmt: skip
    if any(c.startswith("blend") for c in changes) and any(c.startswith(("span-temp=", "compact")) for c in changes):
        raise SystemExit(f"variant {variant!r}: a blend takes neither span-temp nor compact")
    return layout, changes


async def lay_out(url: str, tokenizer: Tokenizer, prompts: Sequence[RagRequest],
                  layouts: dict[str, Technique | None]) -> tuple[ServerInfo, dict[str, list[list[int]]]]:  # fmt: skip
    """Each layout's final-prompt token ids, as the SDK builds them for the server at `url`."""
    async with SpanClient(url, tokenizer=tokenizer) as client:
        ids = {
            name: [list(client.rag_layout(RagRequest(p.task, p.docs, p.system, technique=t or BlockAttention()),
                                          strategy=Strategy.ISPS if t else Strategy.BASELINE).token_ids)
                   for p in prompts]
            for name, t in layouts.items()
        }  # fmt: skip
        return client.info, ids


def _window_starts(ids: Sequence[int], info: ServerInfo) -> torch.Tensor:
    markers = (info.ssep_token_id, info.pdep_token_id, info.hsep_token_id)
    return torch.tensor(window_starts_of_prompt(ids, info.block_size, *markers))


def _outside_rows_of_span_keys(starts: torch.Tensor) -> torch.Tensor:
    """``[q, k]``: the key is inside a span and the row outside every span (the pairs APE rescales,
    and a server's ``--span-bias`` weighs: `weighed_by_span_bias`)."""
    return weighed_by_span_bias(starts[:, None], starts[None, :])


def attention_bias(ids: Sequence[int], info: ServerInfo, changes: Sequence[str], seen: torch.Tensor) -> torch.Tensor:
    """``[q, k]`` additive mask: -inf where ``seen`` is False, else 0 or, with ``span-bias=B``,
    ``B`` on keys inside a span (window start > 0) for rows outside that span (with
    ``first-span-bias=B``, inside the first span only)."""
    starts = _window_starts(ids, info)
    other_span = _outside_rows_of_span_keys(starts)
    bias = torch.zeros(len(ids), len(ids))
    for change in changes:
        if change.startswith("span-bias="):
            bias += torch.where(other_span, float(change.removeprefix("span-bias=")), 0.0)
        elif change.startswith("first-span-bias="):
            first = starts[starts > 0].min() if bool((starts > 0).any()) else -1
            bias += torch.where(other_span & (starts[None, :] == first), float(change.removeprefix("first-span-bias=")),
                                0.0)  # fmt: skip
    return bias.masked_fill(~seen, float("-inf"))


def logit_factor(ids: Sequence[int], info: ServerInfo, changes: Sequence[str]) -> torch.Tensor | None:
    """With ``span-temp=T``: the ``[q, k]`` factor on attention logits, ``1/T`` on keys inside a span
    for rows outside that span, else 1; None without it."""
    change = next((c for c in changes if c.startswith("span-temp=")), None)
    if change is None:
        return None
    other_span = _outside_rows_of_span_keys(_window_starts(ids, info))
    return torch.where(other_span, 1 / float(change.removeprefix("span-temp=")), 1.0)


_FACTOR: list[torch.Tensor] = []  # the logit factor of the rows being computed; the hook has no other way to reach it


def _tempered_attention(module, query, key, value, attention_mask, scaling: float, **kwargs):
    """Eager attention with the logits times ``_FACTOR[-1]`` (the rows of the queries, the last of the
    keys so far) before the mask."""
    key, value = repeat_kv(key, module.num_key_value_groups), repeat_kv(value, module.num_key_value_groups)
    keys = key.shape[2]
    factor = _FACTOR[-1][keys - query.shape[2] : keys, :keys]
    weights = torch.matmul(query, key.transpose(2, 3)) * scaling * factor + attention_mask
    weights = torch.softmax(weights, dim=-1, dtype=torch.float32).to(query.dtype)
    return torch.matmul(weights, value).transpose(1, 2).contiguous(), weights


AttentionInterface.register(TEMPERED, _tempered_attention)


def visibility(ids: Sequence[int], info: ServerInfo, changes: Sequence[str]) -> torch.Tensor:
    """``[q, k]``: MiniPIC's rule for the prompt, then the variant's hiding changes."""
    block, markers = info.block_size, (info.ssep_token_id, info.pdep_token_id, info.hsep_token_id)
    starts = _window_starts(ids, info)
    hidden = torch.tensor(hidden_of_prompt(ids, block, *markers))
    pos, tokens = torch.arange(len(ids)), torch.tensor(ids)
    own_head = (pos - pos % block)[None, :] == starts[:, None]
    seen = (pos[None, :] <= pos[:, None]) & (pos[None, :] >= starts[:, None]) & (~hidden[None, :] | own_head)
    itself = pos[:, None] == pos[None, :]
    opens_block = pos % block == 0
    if "compact" in changes:  # the protocol's unread tokens: PDep markers opening a block, and pads
        unread = torch.tensor(unread_of_prompt(ids, block, info.markers))
        seen &= ~unread[None, :] | unread[:, None]  # an unread row reads causally (no read row sees it)
    if "hide-pdep" in changes:
        seen &= ~((tokens == info.pdep_token_id) & opens_block)[None, :] | itself
    if "hide-spans" in changes:
        span_marker = ((tokens == info.ssep_token_id) | (tokens == info.hsep_token_id)) & opens_block
        seen &= ~span_marker[None, :] | (starts[:, None] == pos[None, :])
    if "hide-pads" in changes:
        seen &= ~(tokens == info.pad_token_id)[None, :] | itself
    if "span-sees-prefix" in changes:
        opening = opens_block & torch.isin(tokens, torch.tensor(markers))
        prefix_end = int(pos[opening].min()) if bool(opening.any()) else 0
        seen |= (starts[:, None] > 0) & (pos[None, :] < prefix_end)
    return seen


def positions_of(ids: Sequence[int], info: ServerInfo, changes: Sequence[str]) -> torch.Tensor:
    """Each token's position: its index, or with ``compact`` its position in the compact reading
    (`minipic_protocol.compact`)."""
    if "compact" not in changes:
        return torch.arange(len(ids))
    return torch.tensor(compact_positions_of_prompt(ids, info.block_size, info.markers))


def blend_of(ids: Sequence[int], info: ServerInfo, changes: Sequence[str]) -> tuple[Blend, torch.Tensor] | None:
    """With ``blend=R`` (or ``blend-random=R``): the prompt's `Blend` over its span tokens, and the
    additive mask of a token recomputed in context (everything before it that no span hides)."""
    change = next((c for c in changes if c.startswith(("blend=", "blend-random="))), None)
    if change is None:
        return None
    block, markers = info.block_size, (info.ssep_token_id, info.pdep_token_id, info.hsep_token_id)
    hidden = torch.tensor(hidden_of_prompt(ids, block, *markers))
    pos = torch.arange(len(ids))
    seen = (pos[None, :] <= pos[:, None]) & (~hidden[None, :] | (pos[:, None] == pos[None, :]))
    name, ratio = change.split("=")
    blend = Blend(float(ratio), candidates=_window_starts(ids, info) > 0, random_choice=name == "blend-random")
    return blend, torch.zeros(len(ids), len(ids)).masked_fill(~seen, float("-inf"))


def model_input(ids: Sequence[int], info: ServerInfo, changes: Sequence[str]) -> list[int]:
    """The ids the model embeds: with ``markers=ID``, each SSep/PDep/HSep marker embedded as token
    ID while the rule (`visibility`) still reads the markers."""
    marker = next((int(c.removeprefix("markers=")) for c in changes if c.startswith("markers=")), None)
    markers = {info.ssep_token_id, info.pdep_token_id, info.hsep_token_id}
    return [marker if marker is not None and t in markers else t for t in ids]


@torch.no_grad()
def answer(model, ids: list[int], bias: torch.Tensor, stop: set[int], max_tokens: int,
           factor: torch.Tensor | None = None, positions: torch.Tensor | None = None) -> list[int]:  # fmt: skip
    """Greedy tokens after the prompt under the additive mask ``bias`` (`attention_bias`) and, if
    given, the logit ``factor`` (`logit_factor`) and the tokens' ``positions`` (`positions_of`); each
    generated token attends as the prompt's last token does, and to itself and earlier answer tokens."""
    positions = torch.arange(len(ids)) if positions is None else positions
    if factor is None:
        return _answer(model, ids, bias, stop, max_tokens, positions)
    # generated tokens are outside every span: their factor row is the prompt's last one, then 1s
    _FACTOR.append(torch.cat([torch.cat([factor, factor[-1:].expand(max_tokens, -1)]),
                              torch.ones(len(ids) + max_tokens, max_tokens)], dim=1))  # fmt: skip
    model.set_attn_implementation(TEMPERED)
    try:
        return _answer(model, ids, bias, stop, max_tokens, positions)
    finally:
        model.set_attn_implementation("eager")
        _FACTOR.pop()


def _answer(model, ids: list[int], bias: torch.Tensor, stop: set[int], max_tokens: int,
            positions: torch.Tensor) -> list[int]:  # fmt: skip
    out = model(input_ids=torch.tensor([ids]), attention_mask=bias[None, None], position_ids=positions[None])
    row, generated = bias[-1], []
    for step in range(max_tokens):
        token = int(out.logits[0, -1].argmax())
        if token in stop:
            break
        generated.append(token)
        row = torch.cat([row, torch.tensor([0.0])])
        mask = row[None, None, None, :]
        out = model(input_ids=torch.tensor([[token]]), attention_mask=mask, past_key_values=out.past_key_values,
                    position_ids=torch.tensor([[int(positions[-1]) + 1 + step]]))  # fmt: skip
    return generated


def answer_variant(model, text_of, stop: set[int], question: Question, ids: list[int], info: ServerInfo,
                   changes: Sequence[str], max_tokens: int) -> tuple[bool, float | None]:  # fmt: skip
    """Whether the variant answers ``question`` from its laid-out ``ids``, and the share of span tokens
    recomputed (a blend) or None."""
    pad = next((int(c.removeprefix("pad=")) for c in changes if c.startswith("pad=")), info.pad_token_id)
    ids = [pad if t == info.pad_token_id else t for t in ids]
    bias = attention_bias(ids, info, changes, visibility(ids, info, changes))
    blending, share = blend_of(ids, info, changes), None
    if blending is None:
        generated = answer(model, model_input(ids, info, changes), bias, stop, max_tokens,
                           logit_factor(ids, info, changes), positions_of(ids, info, changes))  # fmt: skip
    else:
        blend, fresh_bias = blending
        generated = blended_answer(model, model_input(ids, info, changes), bias, fresh_bias, blend, stop, max_tokens)
        share = blend.recomputed_share
    return is_correct(text_of.decode(generated, skip_special_tokens=True), question), share


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--passages", type=Path, required=True, help="2wiki_passages.json")
    parser.add_argument("--model", type=Path, help="default: `minipic fetch-model smollm2`")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--family", default="single")
    parser.add_argument("--questions", type=int, default=150)
    parser.add_argument("--docs", type=int, default=6, help="passages per prompt, the answering ones included")
    parser.add_argument("--variants", nargs="+", default=["full", "refreshed"])
    parser.add_argument("--max-tokens", type=int, default=32,
                        help="as accuracy.py's: the model states a synthetic code late in its sentence")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--order", choices=ORDERS, default="shuffled", help=ORDER_HELP)
    parser.add_argument("--device", default="cpu", help="torch device of the transformers model, e.g. cuda")
    parser.add_argument("--deadline", type=float, help="epoch seconds: questions not answered by every variant "
                        "by then are left out (the JSON says how many were asked)")  # fmt: skip
    args = parser.parse_args()
    source = provenance()  # the tree the run starts from, not the one it ends in
    variants = {v: parse_variant(v) for v in ["full", *(v for v in args.variants if v != "full")]}
    if args.model is None:
        from minipic_server.model_fetch import fetch_model

        args.model = fetch_model("smollm2")

    tokenizer = Tokenizer.from_pretrained(args.model)
    passages = json.loads(args.passages.read_text())
    corpus = Corpus.of(passages, set())
    lengths = [len(tokenizer.encode(t, special_tokens_as_text=False)) for t in corpus.texts]
    corpus.usable = {i for i, n in enumerate(lengths) if n <= 300}  # as accuracy.py's default
    questions: list[Question] = build_family(args.family, extract_facts(passages), corpus, args.questions, args.docs,
                                             150, random.Random(f"{args.seed}:{args.family}"), args.order)  # fmt: skip
    lengths += [len(tokenizer.encode(t, special_tokens_as_text=False)) for t in corpus.texts[len(lengths):]]
    longest = max(lengths[i] for q in questions for i in q.passages)
    prompts = [RagRequest(q.question, tuple(corpus.texts[i] for i in q.passages), SYSTEM) for q in questions]
    layouts = {layout for layout, _ in variants.values()}
    wanted = {name: t for name, t in techniques(longest, BLOCK_SIZE).items() if name in layouts}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    server_args = SERVER_ARGS + (GPU_SERVER_ARGS if args.device.startswith("cuda") else [])
    with local_server(args.model, server_args, args.out.with_suffix(".server.log")) as url:
        info, token_ids = asyncio.run(lay_out(url, tokenizer, prompts, wanted))

    model = AutoModelForCausalLM.from_pretrained(args.model, dtype=torch.float32, attn_implementation="eager")
    model = model.eval().to(args.device)
    torch.set_default_device(args.device)  # every mask, position and id tensor below lives beside the model
    text_of = AutoTokenizer.from_pretrained(args.model)
    stop = {text_of.eos_token_id, *(i for i in range(len(text_of)) if "\n" in text_of.decode([i]))} - {None}
    verdicts: dict[str, list[bool]] = {variant: [] for variant in variants}
    seconds = dict.fromkeys(variants, 0.0)
    recomputed: dict[str, list[float]] = {variant: [] for variant in variants}
    for index, question in enumerate(questions):
        if args.deadline is not None and time.time() > args.deadline:
            print(f"deadline: {index} of {len(questions)} questions answered", flush=True)
            break
        for variant, (layout, changes) in variants.items():
            started = time.perf_counter()
            verdict, share = answer_variant(model, text_of, stop, question, token_ids[layout][index], info, changes,
                                            args.max_tokens)  # fmt: skip
            verdicts[variant].append(verdict)
            if share is not None:
                recomputed[variant].append(share)
            seconds[variant] += time.perf_counter() - started
    if not verdicts["full"]:
        raise SystemExit("no question answered before --deadline")
    report: dict[str, dict] = {}
    for variant in variants:
        correct, asked = sum(verdicts[variant]), len(verdicts[variant])
        report[variant] = {"correct": correct, "questions": asked,
                           "accuracy": round(correct / asked, 4),
                           "accuracy_ci95": [round(x, 4) for x in wilson(correct, asked)],
                           "vs_full": versus(verdicts[variant], verdicts["full"]),
                           "seconds": round(seconds[variant], 1)}  # fmt: skip
        if recomputed[variant]:
            report[variant]["recomputed_share"] = round(sum(recomputed[variant]) / len(recomputed[variant]), 4)
        print(f"{variant:36} {correct}/{asked}  {report[variant]['vs_full']['difference']:+.3f}", flush=True)
    result = {"provenance": source, "model": args.model.name, "family": args.family, "order": args.order,
              "dtype": "float32", "device": args.device, "questions_asked": len(questions),
              "docs_per_prompt": args.docs, "max_tokens": args.max_tokens,
              "markers": {"ssep": info.ssep_token_id, "pdep": info.pdep_token_id, "pad": info.pad_token_id,
                          "hsep": info.hsep_token_id},
              "variants": report, "verdicts": verdicts}  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
