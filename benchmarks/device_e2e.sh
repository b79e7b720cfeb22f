#!/usr/bin/env bash
# End-to-end PIC runs on the H200 device (vLLM 0.26 bundle). See docs/benchmarks.md.
#   call 1: run(command="bash .devbundle/a/stage.sh", carry=[".devbundle/a"])
#   call 2: run(command="source .devbundle/b/setup.sh && bash benchmarks/device_e2e.sh correctness throughput",
#               carry=[".devbundle/b", ".devdata"])
# .devdata holds llama-3.1-8b-config.json and workload.json (benchmarks/workload.py --out).
set -u
OUT=${OUT:-/tmp/minipic-out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1

install_project() {
    python3 -m pip install -q --no-deps --no-build-isolation -e . >"$OUT/install.log" 2>&1 && return
    # Older setuptools cannot build this pyproject: register the entry points by hand.
    local site=/tmp/minipic-site
    mkdir -p "$site/minipic-0.1.0.dist-info"
    printf 'Metadata-Version: 2.1\nName: minipic\nVersion: 0.1.0\n' >"$site/minipic-0.1.0.dist-info/METADATA"
    printf '[vllm.general_plugins]\nminipic = minipic_server.plugin:register\n\n[vllm.endpoint_plugins]\nminipic_info = minipic_server.info_endpoint:InfoEndpointPlugin\n' \
        >"$site/minipic-0.1.0.dist-info/entry_points.txt"
    export PYTHONPATH="$PWD/server_patch:$PWD/kernels:$PWD/sdk:$site:${PYTHONPATH:-}"
    echo "installed via dist-info fallback" >>"$OUT/install.log"
}

run_step() {  # name, seconds, command...
    local name=$1 limit=$2; shift 2
    echo "=== $name $(date +%T)"
    timeout "$limit" "$@" >"$OUT/$name.log" 2>&1
    local rc=$?
    echo "=== $name rc=$rc $(date +%T)"
    grep -E '^\{|"mode"|Error|error:' "$OUT/$name.log" | tail -5
    return $rc
}

install_project
mkdir -p /tmp/llama8b && cp .devdata/llama-3.1-8b-config.json /tmp/llama8b/config.json
for phase in "$@"; do
    case $phase in
    correctness)
        run_step make-model 120 python3 benchmarks/e2e_device.py make-model /tmp/llama8b-4l \
            --config .devdata/llama-3.1-8b-config.json --layers 4
        run_step correctness 240 python3 benchmarks/e2e_device.py correctness \
            --model-dir /tmp/llama8b-4l --out "$OUT/correctness.json" ;;
    correctness-piecewise)
        MINIPIC_FULL_CUDA_GRAPHS=0 run_step correctness-piecewise 240 python3 benchmarks/e2e_device.py \
            correctness --model-dir /tmp/llama8b-4l --out "$OUT/correctness-piecewise.json" ;;
    throughput)
        for mode in ${MODES:-stock pic-nomarkers}; do
            run_step "throughput-$mode" 200 python3 benchmarks/e2e_device.py throughput --mode "$mode" \
                --model-dir /tmp/llama8b --workload .devdata/workload.json --out "$OUT/throughput-$mode.json"
        done ;;
    ttft)
        run_step ttft 240 python3 benchmarks/e2e_device.py ttft --model-dir /tmp/llama8b --out "$OUT/ttft.json" ;;
    spans)
        run_step throughput-pic-spans 240 python3 benchmarks/e2e_device.py throughput --mode pic-spans \
            --model-dir /tmp/llama8b --workload .devdata/workload.json --out "$OUT/throughput-pic-spans.json" ;;
    esac
done
