"""What a request over k cached documents costs outside the forward, stage by stage (no server, no GPU).

A question over k cached ~1,000-token documents computes a few tokens, yet its TTFT grows
with k (docs/benchmarks.md, Figure 2): the serving path does work per prompt token. This
times, on this machine's CPU, the stages MiniPIC runs or can change, with vLLM's own
objects on the Figure 2 prompts (the SDK's layout, Block-Attention, of the same documents):

- ``json_ids``: parsing the request's token ids from JSON (every server pays it; context);
- ``route_vllm`` / ``route_minipic``: the completion body turned into vLLM's ``CompletionRequest``
  as vLLM's route does it (the standard library's JSON, then pydantic over every field and token id)
  and as MiniPIC's does it (`minipic_server.completions_route`);
- ``body_httpx`` / ``body_sdk``: the client building the request, with httpx's ``json=``
  (the standard library's encoder) and as the SDK's transport builds it (msgspec);
- ``detokenizer_vllm`` / ``detokenizer_tail``: vLLM's incremental detokenizer built and
  given the first generated token, primed as vLLM primes it (the whole prompt) and as MiniPIC
  primes it (the tail, `minipic_server.detokenizer_priming`);
- ``hasher_vllm`` / ``hasher_minipic`` / ``hasher_minipic_new_spans``: a vLLM ``Request``
  built with vLLM's block hasher over the plain prompt, and with MiniPIC's over the PIC prompt,
  its documents hashed before (as a question over preloaded documents finds them) or never;
- ``account``: MiniPIC's per-request metrics pass (`minipic_server.metrics.account`);
- ``block_records``: the block records MiniPIC's scheduler ships for a new request whose
  table holds every block of the PIC prompt (`minipic_server.block_plan.BlockPlanner`).

    .venv/bin/python benchmarks/request_overhead.py --tokenizer ../shared/data/llama3-tokenizer \\
        --passages ../shared/data/2wiki_passages.json --out benchmarks/results/request-overhead-cpu.json

Each figure is the median of ``--repeats`` timings, in milliseconds.
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace

import httpx
from vllm.entrypoints.openai.completion.protocol import CompletionRequest
from vllm.sampling_params import SamplingParams
from vllm.tokenizers import get_tokenizer
from vllm.utils.hashing import get_hash_fn_by_name
from vllm.v1.core.kv_cache_utils import KVCacheBlock, get_request_block_hasher, init_none_hash
from vllm.v1.engine import EngineCoreRequest
from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer
from vllm.v1.request import Request

from minipic_client import Tokenizer
from minipic_client.prompt import TECHNIQUES, ChatTemplate, Dependent, PromptBuilder, Text
from minipic_client.tokens import TokenCache
from minipic_client.transport import _json_request as json_request
from minipic_server import detokenizer_priming
from minipic_server.block_plan import BlockPlanner, StepRecords
from minipic_server.completions_route import token_prompt_request
from minipic_server.config import PicConfig
from minipic_server.hashing import make_pic_block_hasher
from minipic_server.markers import load_tokenizer, pick_marker_ids
from minipic_server.metrics import account

sys.path.insert(0, str(Path(__file__).resolve().parent))
from served import passages_as_docs  # noqa: E402
from workload import SYSTEM  # noqa: E402

from provenance import provenance  # noqa: E402

TASK = "Which document mentions a river?"  # Figure 2's question
URL = "http://127.0.0.1:8000/v1/completions"


class TailPrimed(FastIncrementalDetokenizer):
    __init__ = detokenizer_priming.wrap_fast_detokenizer_init(FastIncrementalDetokenizer.__init__)


def median_ms(run: Callable[[], object], repeats: int) -> float:
    run()  # warm
    times = []
    for _ in range(repeats):
        started = time.perf_counter()
        run()
        times.append(time.perf_counter() - started)
    return round(statistics.median(times) * 1e3, 3)


def first_token_text(detokenizer_class: type, tokenizer, prompt: list[int], token: int) -> str:
    request = EngineCoreRequest(request_id="r", prompt_token_ids=prompt, mm_features=None,
                                sampling_params=SamplingParams(max_tokens=1), pooling_params=None, arrival_time=0.0,
                                lora_request=None, cache_salt=None, data_parallel_rank=None)  # fmt: skip
    detokenizer = detokenizer_class(tokenizer, request)
    detokenizer.update([token], False)
    return detokenizer.get_next_output_text(True, True)


def hashed(prompt: list[int], hasher) -> Request:
    return Request("r", prompt, SamplingParams(max_tokens=1), None, block_hasher=hasher)


def planner_step(prompt: list[int], block_size: int, pic: PicConfig) -> Callable[[], StepRecords]:
    """The records of a new request's first step, its table holding a block for every prompt block
    (each call builds the vLLM ``Request`` afresh, 0.1 ms of it: records are cached on it)."""
    table = [KVCacheBlock(block_id) for block_id in range(-(-len(prompt) // block_size))]
    manager = SimpleNamespace(coordinator=SimpleNamespace(single_type_managers=[SimpleNamespace(
        req_to_blocks={"r": table})]), block_pool=SimpleNamespace(num_gpu_blocks=len(table)))
    requests: dict[str, Request] = {}
    planner = BlockPlanner(SimpleNamespace(kv_cache_manager=manager, requests=requests, block_size=block_size), pic)
    output = SimpleNamespace(scheduled_new_reqs=[SimpleNamespace(req_id="r", block_ids=([b.block_id for b in table],))],
                             scheduled_cached_reqs=SimpleNamespace(req_ids=[], new_block_ids=[]))  # fmt: skip

    def step() -> StepRecords:
        requests["r"] = Request("r", prompt, SamplingParams(max_tokens=1), None)
        return planner.records(output)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokenizer", type=Path, required=True)
    parser.add_argument("--passages", type=Path, required=True)
    parser.add_argument("--docs", type=int, nargs="+", default=[1, 2, 4, 8, 16, 32])
    parser.add_argument("--technique", choices=sorted(TECHNIQUES), default="block")
    parser.add_argument("--block-size", type=int, default=16)
    parser.add_argument("--hash", default="sha256", help="vLLM's --prefix-caching-hash-algo")
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--out", type=Path, required=True)
    args = parser.parse_args()

    vllm_tokenizer = get_tokenizer(str(args.tokenizer))
    markers = pick_marker_ids(load_tokenizer(str(args.tokenizer)))
    pic = PicConfig(*markers.ids)
    sdk_tokenizer = Tokenizer.from_pretrained(args.tokenizer)
    builder = PromptBuilder(TokenCache(sdk_tokenizer, markers.ids), block_size=args.block_size,
                            ssep_token_id=markers.ssep_token_id, pdep_token_id=markers.pdep_token_id,
                            pad_token_id=markers.pad_token_id, hsep_token_id=markers.hsep_token_id)  # fmt: skip
    chat = ChatTemplate(sdk_tokenizer) if sdk_tokenizer.chat_template else None
    hash_fn = get_hash_fn_by_name(args.hash)
    init_none_hash(hash_fn)
    stock_hasher = get_request_block_hasher(args.block_size, hash_fn)
    pic_hasher = make_pic_block_hasher(args.block_size, hash_fn, pic)
    detokenizer_priming.activate()

    passages = json.loads(args.passages.read_text())
    docs_1k = passages_as_docs(passages, vllm_tokenizer, 1000, max(args.docs))
    token = vllm_tokenizer.encode(" river", add_special_tokens=False)[0]
    rows = []
    for k in args.docs:
        docs = random.Random(k).sample(docs_1k, k)
        documents = TECHNIQUES[args.technique].documents(docs)
        # As `SpanClient.rag_layout` lays it out: the chat template's turns, or raw without one.
        parts = chat.parts(SYSTEM, documents, TASK) if chat else [Text(SYSTEM), *documents, Dependent(TASK)]
        plain = builder.build(parts, pic=False, add_special_tokens=not chat).token_ids
        laid_out = builder.build(parts, add_special_tokens=not chat).token_ids
        request_body = {"model": "m", "prompt": list(laid_out), "max_tokens": 1, "stream": True}
        body = json.dumps(request_body)
        same_text = (first_token_text(FastIncrementalDetokenizer, vllm_tokenizer, list(laid_out), token)
                     == first_token_text(TailPrimed, vllm_tokenizer, list(laid_out), token))  # fmt: skip
        timed = {
            "json_ids": lambda: json.loads(body),
            "route_vllm": lambda: CompletionRequest.model_validate(json.loads(body)),
            "route_minipic": lambda: token_prompt_request(body.encode(), CompletionRequest),
            "body_httpx": lambda: httpx.Request("POST", URL, json=request_body),
            "body_sdk": lambda: httpx.Request("POST", URL, **json_request(request_body, None)),
            "detokenizer_vllm": lambda: first_token_text(FastIncrementalDetokenizer, vllm_tokenizer,
                                                         list(laid_out), token),
            "detokenizer_tail": lambda: first_token_text(TailPrimed, vllm_tokenizer, list(laid_out), token),
            "hasher_vllm": lambda: hashed(list(plain), stock_hasher),
            "hasher_minipic": lambda: hashed(list(laid_out), pic_hasher),
            "hasher_minipic_new_spans": lambda: hashed(list(laid_out),
                                                       make_pic_block_hasher(args.block_size, hash_fn, pic)),
            "account": lambda: account(laid_out, len(laid_out) - 1, args.block_size, pic),
            "block_records": planner_step(list(laid_out), args.block_size, pic),
        }  # fmt: skip
        row = {"k": k, "plain_tokens": len(plain), "pic_tokens": len(laid_out), "same_first_token_text": same_text,
               **{f"{name}_ms": median_ms(run, args.repeats) for name, run in timed.items()}}  # fmt: skip
        rows.append(row)
        print(json.dumps(row), flush=True)
    result = {"provenance": provenance(), "technique": args.technique, "block_size": args.block_size,
              "hash": args.hash, "repeats": args.repeats, "rows": rows}  # fmt: skip
    args.out.write_text(json.dumps(result, indent=1) + "\n")


if __name__ == "__main__":
    main()
