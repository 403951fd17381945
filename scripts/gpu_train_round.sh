#!/usr/bin/env bash
# One training call on the GPU host (after `bash .gpu-carry/a/stage.sh` in the call before, with
# .gpu-carry/b and the job folder carried in this one): train reward variants from SmolLM2 side
# by side (one process each, see gpu_train_surrogates.py --parallel) and forecast the eval set;
# outputs in $OUT/train for `scripts/surrogate_job.py ingest`, also packed as $OUT/train-*.tar
# (a call returns at most 8 files).
#
#   [KC_TRAIN_GPUS=0,1,2] [KC_DEADLINE_S=480] [KC_TRAIN_OUT=/root/kc-keep/train] [KC_TRAIN_FROM=DIR] \
#     bash scripts/gpu_train_round.sh JOB_DIR VARIANTS [EXTRA ARGS, e.g. --gpus 0,1,2]
#
# Seen on the H200 (job of 181 train / 337 eval pairs, full prompts of ~2,900 tokens):
# - 2026-11-29, one variant at a time, gradient checkpointing on: GGUF conversion 42 s, base
#   logprob eval 29 s, base verbalized eval (674 answers of 256 tokens, none parses) 213 s,
#   60-step warm-up 20 s, GRPO 20-25 s per 8 x 8 step: the 590 s call ended after 3 steps.
#   TRL's gradient checkpointing also switches the KV cache off in rollouts, hence off here.
# - 2026-11-29 session 3, variants side by side: with micro-batches of 16 completions each
#   process in GRPO held 53-75 GiB, so three on one GPU (or two beside a measuring worker) ran out of
#   memory; hence micro_batch_size=4. Alone, a variant ran its 20 GRPO steps in 8-36 s each
#   (~6 min) and its logprob eval in 33-42 s; the verbalized eval did not finish before the
#   deadline. One bf16 run hit a NaN gradient at step 12 (models/training.py now keeps a small
#   model's weights in float32).
# - 2026-11-29 session 4, one variant per GPU (four-GPU host), float32 weights under bf16
#   autocast, micro-batches of 8: all three logged a NaN gradient norm at GRPO step 1 (39 s) and
#   died in the next rollout. Cause: cuDNN's attention backward on torch 2.11 returns NaN at
#   lengths 64 mod 128 with left padding (pytorch/pytorch#196678; seen on the H200 with
#   scripts/gpu_check_sdpa.py), now switched off in models/training.py; small models also train
#   in float32 now, non-finite steps are skipped (models/callbacks.py).
# - 2026-11-29 session 5, two H200s, the three variants over three calls (GPUs 0,1,1 then 0,1,0
#   then 0,0,1; KC_DEADLINE_S 500, 545, 555): no NaN in 60 GRPO steps. Alone on a GPU a step took
#   16-50 s, two sharing one 26-107 s; a call with finish.sh got 6-11 steps, a resuming one 7-14.
#   Logprob eval of 784 pairs 77-119 s, verbalized (2 x 784 answers) 416 s: budget a fourth call
#   for the verbalized readouts of all three.
#
# The run folder is KC_TRAIN_OUT (default /root/kc-keep/train), which a warm host keeps between
# the calls of a session: GRPO checkpoints every step there and stops cleanly 90 s before the
# deadline, so the same command in the next call resumes the variants where they stopped, then
# evaluates them (and skips what is done). Each call packs what is finished into $OUT.
set -u
job=$1 variants=$2; shift 2
out=${OUT:?set OUT to the output folder}
run=${KC_TRAIN_OUT:-/root/kc-keep/train}
mkdir -p "$run"
# KC_TRAIN_FROM=DIR: a results folder that came back from an earlier session (summary.json, the
# variants' tars, forecasts), carried to a fresh host: the run goes on from it (missing readouts
# are evaluated, nothing trained again). Files already in the run folder are kept.
[ -n "${KC_TRAIN_FROM:-}" ] && cp -n "$KC_TRAIN_FROM"/* "$run"/
gguf=/root/kc-stash/SmolLM2-135M-Instruct.Q4_1.gguf
if [ -f .gpu-carry/b/finish.sh ]; then
  source .gpu-carry/b/finish.sh > "$out/finish.log" 2>&1 || { echo "finish.sh failed"; cat "$out/finish.log"; exit 1; }
elif [ -f "$gguf" ]; then  # a later call on the warm host: the GGUF and the wheels are still there
  [ -d /tmp/site/trl ] || python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site /root/kc-stash/wh/*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH} KERNELCAST_BASE_GGUF=$gguf
else
  echo "error: no base model here: carry .gpu-carry/b (after .gpu-carry/a/stage.sh in the call before)"; exit 1
fi
# The converted checkpoint stays on the warm host too, so a later call skips the conversion.
export KERNELCAST_HOME=/root/kc-keep/home HF_HUB_OFFLINE=1 TOKENIZERS_PARALLELISM=false
gpus=${KC_TRAIN_GPUS:-}
[ -n "$gpus" ] && export CUDA_VISIBLE_DEVICES=$gpus  # the parent's base-model eval, too
python3 scripts/gpu_train_surrogates.py --job "$job" --out "$run" --profile gpu --variants "$variants" \
  --parallel --deadline-s "${KC_DEADLINE_S:-0}" \
  --set max_completion_length=160 --set gradient_checkpointing=false --set micro_batch_size=4 --set sft_steps=60 --set sft_lr=0.0002 \
  --repeats 2 --batch-size 64 --eval-max-new-tokens 160 --base-readouts logprob "$@" > "$out/train.log" 2>&1
grep -v "it/s\]" "$out/train.log" | tail -25
for f in "$run"/train-*.log; do echo "== $f"; grep -v "it/s\]" "$f" | grep -i "warm-up\|resuming\|stopped\|parse\|error\|Traceback\|trained in" | tail -8; done
ls -la "$run"
# Pack what is finished (the children's folders, holding checkpoints, stay on the host): one tar
# per adapter (each a few MB), one for the rest.
mkdir -p "$out/train" && find "$run" -maxdepth 1 -type f -exec cp {} "$out/train/" \;
(cd "$out" && for t in train/*.tar; do [ -e "$t" ] && mv "$t" "train-$(basename "$t")"; done
 tar cf train-rest.tar train && rm -rf train)
