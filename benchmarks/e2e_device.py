"""End-to-end PIC on a GPU with vLLM's offline engine (run on the H200 device; see docs/benchmarks.md).

Subcommands, each meant to run in its own process so GPU memory starts clean:

- ``make-model DIR --config CFG --layers N``: a Llama with seeded random weights (std 0.02).
- ``throughput --mode stock|pic-nomarkers|pic-spans``: prefill-only (max_tokens=1) samples/s
  on the pre-tokenized workload from `workload.py`; dummy weights from a config-only dir.
- ``ttft``: single-request latency for k 1,000-token documents, spans cold vs cached.
- ``correctness``: PIC without markers vs stock FlashAttention, and cached spans vs spans
  never prefilled, on a real-weights model from ``make-model``.
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

# Llama 3 reserved special tokens 10/11/12 (what `minipic serve` picks for Llama 3).
SSEP, PDEP, PAD = 128020, 128021, 128022
MARKERS = {"ssep_token_id": SSEP, "pdep_token_id": PDEP, "pad_token_id": PAD}
BLOCK = 16


def padded(tokens: list[int]) -> list[int]:
    return tokens + [PAD] * (-len(tokens) % BLOCK)


def make_llm(model_dir: str, pic: bool, dummy: bool, **kwargs):
    from vllm import LLM

    return LLM(
        model=model_dir,
        load_format="dummy" if dummy else "auto",
        dtype="bfloat16",
        skip_tokenizer_init=True,
        enable_prefix_caching=True,
        block_size=BLOCK,
        max_model_len=kwargs.pop("max_model_len", 8192),
        seed=0,
        attention_backend=None if pic else "FLASH_ATTN",
        additional_config={"minipic": MARKERS} if pic else {},
        **kwargs,
    )


def prompts_of(token_lists):
    from vllm.inputs import TokensPrompt

    return [TokensPrompt(prompt_token_ids=t) for t in token_lists]


def timed_generate(llm, token_lists, params) -> tuple[float, list]:
    start = time.perf_counter()
    outputs = llm.generate(prompts_of(token_lists), params, use_tqdm=False)
    return time.perf_counter() - start, outputs


def cmd_make_model(args) -> None:
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    config = json.loads(Path(args.config).read_text())
    config["num_hidden_layers"] = args.layers
    torch.manual_seed(0)
    llama_config = LlamaConfig(**{k: v for k, v in config.items() if k != "architectures"})
    llama_config.initializer_range = 0.02
    with torch.device("cuda"):
        model = LlamaForCausalLM(llama_config).to(torch.bfloat16)
    model.save_pretrained(args.dir)
    (Path(args.dir) / "config.json").write_text(json.dumps({**json.loads(
        (Path(args.dir) / "config.json").read_text()), "architectures": ["LlamaForCausalLM"]}))


def cmd_throughput(args) -> None:
    from vllm import SamplingParams

    workload = json.loads(Path(args.workload).read_text())
    passages, samples = workload["passages"], workload["samples"][: args.samples]
    prefix = workload["prefix"]
    params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    pic = args.mode != "stock"
    llm = make_llm(args.model_dir, pic=pic, dummy=True, max_num_seqs=args.max_num_seqs)
    timed_generate(llm, [[1000 + i] * 700 for i in range(64)], params)  # warm-up, no shared blocks
    result = {"mode": args.mode, "samples": len(samples)}
    if args.mode == "pic-spans":
        spans = {i: padded([SSEP, *passages[i]]) for s in samples for i in s["docs"]}
        head = padded(prefix)
        finals = [head + [t for i in s["docs"] for t in spans[i]] + [PDEP, *s["question"]] for s in samples]
        span_s, _ = timed_generate(llm, [head, *spans.values()], params)
        final_s, outputs = timed_generate(llm, finals, params)
        result.update(span_prefill_s=span_s, final_s=final_s, unique_spans=len(spans))
        elapsed = span_s + final_s
    else:
        plain = [prefix + [t for i in s["docs"] for t in passages[i]] + s["question"] for s in samples]
        elapsed, outputs = timed_generate(llm, plain, params)
    prompt_tokens = sum(len(o.prompt_token_ids) for o in outputs)
    cached = sum(o.num_cached_tokens or 0 for o in outputs)
    result.update(
        elapsed_s=elapsed,
        samples_per_s=len(samples) / elapsed,
        final_prompt_tokens=prompt_tokens,
        final_cached_fraction=cached / prompt_tokens,
    )
    print(json.dumps(result))
    Path(args.out).write_text(json.dumps(result, indent=2))


def cmd_ttft(args) -> None:
    """Single-request time for k documents of 1,000 tokens: spans computed vs read from cache."""
    import random

    from vllm import SamplingParams

    rng = random.Random(1)
    params = SamplingParams(max_tokens=1, temperature=0.0, detokenize=False)
    llm = make_llm(args.model_dir, pic=True, dummy=True, max_num_seqs=64, max_model_len=40960)
    timed_generate(llm, [[1000 + i] * 700 for i in range(8)], params)
    head = padded([128000, *(rng.randrange(1000, 120000) for _ in range(40))])
    rows = []
    for k in (1, 2, 4, 8, 16, 32):
        spans = [padded([SSEP, *(rng.randrange(1000, 120000) for _ in range(999))]) for _ in range(k)]
        final = head + [t for sp in spans for t in sp] + [PDEP, *(rng.randrange(1000, 120000) for _ in range(20))]
        llm.reset_prefix_cache()
        cold_s, _ = timed_generate(llm, [final], params)
        llm.reset_prefix_cache()
        timed_generate(llm, [head, *spans], params)
        warm_s, out = timed_generate(llm, [final], params)
        rows.append({"docs": k, "cold_s": cold_s, "cached_s": warm_s, "speedup": cold_s / warm_s,
                     "cached_tokens": out[0].num_cached_tokens, "prompt_tokens": len(final)})
        print(json.dumps(rows[-1]))
    Path(args.out).write_text(json.dumps(rows, indent=2))


def cmd_correctness(args) -> None:
    import random

    from vllm import SamplingParams

    rng = random.Random(0)

    def text(n: int) -> list[int]:
        return [rng.randrange(1000, 120000) for _ in range(n)]

    plain = [[128000, *text(n)] for n in (37, 300, 1500, 4000)]
    head = padded([128000, *text(40)])
    docs = [padded([SSEP, *text(n)]) for n in (90, 130, 250, 1100)]
    finals = [head + docs[2] + docs[0] + docs[3] + docs[1] + [PDEP, *text(30)],
              head + docs[1] + docs[3] + [PDEP, *text(20)]]
    params = SamplingParams(max_tokens=8, temperature=0.0, logprobs=5, detokenize=False)
    report: dict = {}
    outputs = {}
    for mode in ("stock", "pic"):
        llm = make_llm(args.model_dir, pic=mode == "pic", dummy=False, max_num_seqs=64,
                       gpu_memory_utilization=0.4)
        _, outputs[mode] = timed_generate(llm, plain, params)
        if mode == "pic":
            _, cold = timed_generate(llm, finals, params)  # spans computed in context
            llm.reset_prefix_cache()
            timed_generate(llm, [head, *docs], SamplingParams(max_tokens=1, detokenize=False))
            _, warm = timed_generate(llm, finals, params)  # spans read from the cache
            report["span_cached_tokens"] = [o.num_cached_tokens for o in warm]
            report["span_final_prompt_tokens"] = [len(o.prompt_token_ids) for o in warm]
            report["spans_cold_vs_warm"] = compare(cold, warm)
        del llm
        import gc

        import torch

        gc.collect()
        torch.cuda.empty_cache()
    report["pic_nomarkers_vs_stock"] = compare(outputs["stock"], outputs["pic"])
    print(json.dumps(report, indent=2))
    Path(args.out).write_text(json.dumps(report, indent=2))


def compare(a, b) -> dict:
    """Greedy-token agreement and the largest logprob difference over shared top-5 entries."""
    same_tokens, worst = 0, 0.0
    for x, y in zip(a, b):
        tx, ty = x.outputs[0].token_ids, y.outputs[0].token_ids
        same_tokens += tx == ty
        for step_x, step_y, token in zip(x.outputs[0].logprobs, y.outputs[0].logprobs, tx):
            if token in step_y:
                worst = max(worst, abs(step_x[token].logprob - step_y[token].logprob))
            if tx != ty:
                break
    return {"prompts": len(a), "identical_greedy_tokens": same_tokens, "max_abs_logprob_diff": worst}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    make = sub.add_parser("make-model")
    make.add_argument("dir")
    make.add_argument("--config", required=True)
    make.add_argument("--layers", type=int, default=4)
    thr = sub.add_parser("throughput")
    thr.add_argument("--mode", choices=["stock", "pic-nomarkers", "pic-spans"], required=True)
    thr.add_argument("--model-dir", required=True)
    thr.add_argument("--workload", required=True)
    thr.add_argument("--samples", type=int, default=1000)
    thr.add_argument("--max-num-seqs", type=int, default=1024)
    thr.add_argument("--out", required=True)
    ttft = sub.add_parser("ttft")
    ttft.add_argument("--model-dir", required=True)
    ttft.add_argument("--out", required=True)
    cor = sub.add_parser("correctness")
    cor.add_argument("--model-dir", required=True)
    cor.add_argument("--out", required=True)
    args = parser.parse_args()
    {"make-model": cmd_make_model, "throughput": cmd_throughput, "ttft": cmd_ttft,
     "correctness": cmd_correctness}[
        args.command
    ](args)


if __name__ == "__main__":
    main()
