#!/bin/bash
# The GPU batch (issue 44): one device call of at most 10 minutes that runs the image workload at
# its GPU settings and the language workload, verifies and audits both runs, and writes every
# figure to $OUT/<date>-<device>.json (benchmarks/gpu_figures.py), to be copied to
# benchmarks/gpu/ beside its rows in benchmarks/RESULTS.md.
#
#   device run, carry [".whl"]:   bash benchmarks/gpu_batch.sh
#   on the CPU first (no .whl):   AIPERF_GPU_BATCH_S=45 bash benchmarks/gpu_batch.sh
#
# The GPU image has JAX but not Keras, Ray, Optuna, pydantic, ...: the wheels it needs are
# downloaded here beforehand by benchmarks/gpu_wheels.sh into .whl/ (git-ignored) and installed
# there into /tmp/site (a Python that has them already, as on a CPU trial, installs nothing). Each
# step has its own timeout, so a slow step cannot take the others' figures; what each wrote lands
# in $OUT. Budgets: AIPERF_GPU_BATCH_S seconds a run (default 150),
# AIPERF_GPU_IMAGE (default: the synthetic config at 64x64, width 64, batch 256, bf16 on JAX),
# AIPERF_GPU_LANGUAGE (default: the gpu config, what `aiperf run` picks on a GPU host: llm-official's seed
# on the embedded corpus, epochs sized by each worker's ceiling; 2026-11-27 ran it at 100 steps an epoch).
# The CPU trial of 2026-12-07 ran both with small nets (AIPERF_GPU_IMAGE/LANGUAGE overridden) and 40 s.
set -u
OUT=${OUT:-/tmp/gpu-batch-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
BUDGET=${AIPERF_GPU_BATCH_S:-150}
WORK=${AIPERF_GPU_WORK:-/tmp/gpu-batch}
rm -rf "$WORK" && mkdir -p "$WORK"
if ! python3 -c "import keras, ray, optuna, pydantic" 2>/dev/null && ls .whl/*.whl >/dev/null 2>&1; then
  python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl \
    || exit 1
  export PYTHONPATH=/tmp/site:.:benchmarks
else
  export PYTHONPATH=.:benchmarks
fi
export KERAS_BACKEND=jax PYTHONUNBUFFERED=1 TF_CPP_MIN_LOG_LEVEL=3
command -v nvidia-smi >/dev/null && nvidia-smi -L
python3 -c "import jax, keras, ray, optuna; print('jax', jax.__version__, jax.devices(), 'keras', keras.__version__, 'ray', ray.__version__)" \
  || exit 1
device=$(python3 -c "import jax; d = jax.devices()[0]; print((d.device_kind if d.platform != 'cpu' else 'cpu').replace(' ', '-'))")
aiperf() { python3 -m aiperf.cli "$@"; }
# one workload: run, verify, audit; its checks as NAME=verify:RC,audit:RC
workload() {
  local name=$1; shift
  echo "== $name: $BUDGET s"
  timeout $((BUDGET + 240)) python3 -m aiperf.cli run "$@" --set model.backend=jax --set run.time_budget_s="$BUDGET" \
      --set run.results_dir="$WORK/$name"
  local run
  run=$(ls -d "$WORK/$name"/*/ 2>/dev/null | head -1)
  [ -z "$run" ] && { echo "$name: no run directory"; return; }
  timeout 120 python3 -m aiperf.cli verify "$run"; local verify=$?
  timeout 240 python3 -m aiperf.cli audit "$run"; local audit=$?
  for f in summary.json ledger.jsonl telemetry.jsonl audit.json; do [ -f "$run/$f" ] && cp "$run/$f" "$OUT/$name-$f"; done
  RUNS+=(--run "$name=$run" --check "$name=verify:$verify,audit:$audit")
}
RUNS=()
read -r -a IMAGE <<<"${AIPERF_GPU_IMAGE:---config synthetic --set dataset.synthetic.shape=[64,64,3] --set model.width=64 --set train.batch_size=256}"
workload image "${IMAGE[@]}"
read -r -a LANGUAGE <<<"${AIPERF_GPU_LANGUAGE:---config gpu}"
workload language "${LANGUAGE[@]}"
python3 benchmarks/gpu_figures.py "${RUNS[@]}" --json "$OUT/$(date -u +%F)-$device.json"
echo "== done"
