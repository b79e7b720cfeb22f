#!/usr/bin/env bash
# What `benchmarks/h200.sh` needs on a bare device machine beside vLLM's bundle, in
# git-ignored folders to name in a device call's `carry`:
#   .devdata  the Llama-3.1-8B config, the Llama 3 tokenizer and the 2Wiki passages (xz)
#   .whl      the SDK's dependencies the device image lacks
#   .whl-profile  py-spy, for `served --profile` and `ttft` only: carried only then, since a call's
#             64 MiB has little room beside .devbundle/b and this checkout
# Usage, from the repository root: bash tools/device-carry.sh [DATA_DIR]   (default ../shared/data)
set -euo pipefail
DATA=${1:-../shared/data}
mkdir -p .devdata .whl .whl-profile
cp "$DATA/llama-3.1-8b-config.json" "$DATA/llama3-tokenizer/tokenizer_config.json" .devdata/
[ -f .devdata/tokenizer.json.xz ] || xz -9 -c "$DATA/llama3-tokenizer/tokenizer.json" >.devdata/tokenizer.json.xz
[ -f .devdata/2wiki_passages.json.xz ] || xz -9 -c "$DATA/2wiki_passages.json" >.devdata/2wiki_passages.json.xz
download() {
    local into=$1
    shift
    python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 --platform manylinux_2_5_x86_64 \
        --platform manylinux1_x86_64 -d "$into" "$@"
}
download .whl httpx-sse==0.4.3 httpx-aiohttp==0.2.0
download .whl-profile py-spy==0.4.1
du -sh .devdata .whl .whl-profile
