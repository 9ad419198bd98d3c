#!/usr/bin/env bash
# The GPU check: VGG19 training images/s at 224 (float32 and mixed_bfloat16, without and with XLA) against
# plain Keras, the input-bound ratios of the 224 and CIFAR pipelines, trainer.precision=auto against float32 (the
# 224 step and the digits demo, both printed), and each export format's latency.
#
#   pip install -e ".[gpu,export]" && bash benchmarks/gpu_check.sh      # one GPU: within 8 minutes
#   bash benchmarks/gpu_check.sh --cpu-smoke                            # the same paths at toy sizes, on a CPU
set -euo pipefail
cd "$(dirname "$0")/.."
export TF_CPP_MIN_LOG_LEVEL="${TF_CPP_MIN_LOG_LEVEL:-2}"
exec python -m benchmarks.gpu "$@"
