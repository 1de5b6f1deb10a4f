#!/usr/bin/env bash
# Decode and training speed of two source trees of ssmhub in one run, interleaved (old, new, old, new, ...), same
# virtual environment, one thread: for a refactor whose promise is "speed unchanged". Each benchmark also times its
# peer (transformers' GPT-2) in the same run, so the ssmhub ÷ GPT-2 ratio is comparable across the two trees.
#   usage: experiments/compare_trees.sh OLD_SRC NEW_SRC [ROUNDS]     (e.g. a `git archive REV | tar -x` copy's src/)
set -euo pipefail
old=$1 new=$2 rounds=${3:-3}
py=${PYTHON:-.venv/bin/python}
for i in $(seq "$rounds"); do
  for tree in old new; do
    src=$old; [ "$tree" = new ] && src=$new
    echo "=== decode $tree $i"
    PYTHONPATH=$src OMP_NUM_THREADS=1 $py benchmarks/decode_vs_context.py --contexts 128 1024 --steps 32 --repeats 5 \
      --warmup 8 --threads 1 --no-static-cache --no-write 2>&1 | grep -E "^\| (128|1024) "
    echo "=== train $tree $i"
    PYTHONPATH=$src OMP_NUM_THREADS=1 $py benchmarks/train_throughput.py --family dlr --seq-lens 512 2048 \
      --tokens-per-step 4096 --hidden 128 --layers 2 --steps 4 --warmup 1 --repeats 2 --threads 1 --no-write 2>&1 \
      | grep -E "^\| *(512|2048) "
  done
done
