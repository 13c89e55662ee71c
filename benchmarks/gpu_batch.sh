#!/bin/bash
# The GPU batch of benchmarks/RESULTS.md as one device call (a session has 15 minutes of device
# time, a call at most 10): a 3-minute `synthetic` run with NVML sampling (busy fraction and the
# whole-run score), the bf16 matmul peak it is set against, and the trainer-vs-reference
# throughput of the seed, the searched net and ResNet-50 at 224x224. Each step has its own
# timeout so one slow step cannot take the others' results; what each wrote lands in $OUT.
#
#   device run, carry [".whl/site312.tar.xz"]:  bash benchmarks/gpu_batch.sh [STEP...]
#   steps: busy peak throughput first_step agents startup llm (default: the first five, in that order)
set -u
OUT=${OUT:-/tmp/gpu-batch-out}
mkdir -p "$OUT"
exec > >(tee "$OUT/log.txt") 2>&1
tar -C /tmp -xJf .whl/site312.tar.xz || exit 1
export PYTHONPATH=/tmp/site312:.:benchmarks KERAS_BACKEND=jax PYTHONUNBUFFERED=1
nvidia-smi -L
steps=" ${*:-busy peak throughput first_step agents} "
python3 -c "import jax, keras, ray, optuna; print('jax', jax.__version__, jax.devices(), 'keras', keras.__version__, 'ray', ray.__version__)"

if [[ $steps == *" busy "* ]]; then
echo "== busy fraction and whole-run score: synthetic, 3 minutes"
timeout 300 python3 benchmarks/busy_fraction.py --minutes 3 --backend jax --results-dir /tmp/busy --json "$OUT/busy.json"
run=$(ls -d /tmp/busy/*/ 2>/dev/null | head -1)
for f in ledger.jsonl summary.json telemetry.jsonl; do [ -f "$run/$f" ] && cp "$run/$f" "$OUT/$f"; done
fi

if [[ $steps == *" peak "* ]]; then
echo "== bf16 matmul peak"
timeout 60 python3 -c "import json, common; print(json.dumps(common.jax_matmul_peak('bfloat16')))" | tee "$OUT/peak.json"
fi

if [[ $steps == *" throughput "* ]]; then
echo "== trainer vs hand-written step"
timeout 200 python3 benchmarks/trial_throughput.py --no-fit-variants --json "$OUT/trial_throughput.json"
fi

if [[ $steps == *" first_step "* ]]; then
echo "== a re-tune's first step, ResNet-50 224x224 b128"
timeout 150 python3 benchmarks/first_step.py --backend jax --arch resnet50 --image 224 --batch 128 --steps 4 --reps 1 --json "$OUT/first_step.json"
fi
if [[ $steps == *" agents "* ]]; then
echo "== one node agent per node (cluster.actors=per_node): synthetic, 90 s, its worker a process on the GPU"
timeout 240 python3 -m aiperf.cli run --config synthetic --set cluster.actors=per_node --set model.backend=jax \
    --set run.time_budget_s=90 --set run.results_dir=/tmp/agents
run=$(ls -d /tmp/agents/*/ 2>/dev/null | head -1)
for f in ledger.jsonl summary.json; do [ -f "$run/$f" ] && cp "$run/$f" "$OUT/agents-$f"; done
[ -n "$run" ] && timeout 120 python3 -m aiperf.cli verify "$run"
fi
if [[ $steps == *" startup "* ]]; then
echo "== the start-up fill at 65,536 simulated workers by expansion processes (the machine's CPUs, wall clock)"
nproc
for p in 0 4 8 15; do
  OMP_NUM_THREADS=1 timeout 120 python3 benchmarks/scale_sim.py --workers 65536 --trials-per-worker 3 --startup-only \
      --processes $p --json "$OUT/startup-$p.json"
done
fi
if [[ $steps == *" llm "* ]]; then
echo "== the language-model workload: llm-official's seed (13.2 M parameters, bf16) on the embedded corpus, 4 minutes"
timeout 330 python3 -m aiperf.cli run --config llm-official --set dataset.name=text --set dataset.path=null \
    --set model.backend=jax --set run.time_budget_s=240 --set lm.steps_per_epoch=100 --set run.results_dir=/tmp/llm
run=$(ls -d /tmp/llm/*/ 2>/dev/null | head -1)
for f in ledger.jsonl summary.json; do [ -f "$run/$f" ] && cp "$run/$f" "$OUT/llm-$f"; done
[ -n "$run" ] && timeout 120 python3 -m aiperf.cli verify "$run"
fi
echo "== done"
