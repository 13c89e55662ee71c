#!/bin/bash
# The wheels benchmarks/gpu_batch.sh needs on the GPU machine, downloaded here into .whl/ (git-ignored).
#
# That machine's Python (3.12, x86-64) has JAX, NumPy, SciPy, pandas, scikit-learn, PyYAML, psutil
# and Ray's own small dependencies, but not Keras, Ray, Optuna, pydantic, orjson, mlxtend or
# MLCommons' logger, and it reaches no package index. Ray's wheel carries Java jars aiperf never
# uses; they are dropped (the working tree that travels is limited to 64 MiB).
#   bash benchmarks/gpu_wheels.sh && du -sh .whl
set -euo pipefail
grep -qx '/.whl/' .git/info/exclude 2>/dev/null || echo '/.whl/' >> .git/info/exclude
rm -rf .whl && mkdir -p .whl
python3 -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
  --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 --platform manylinux_2_17_x86_64 \
  --platform manylinux2014_x86_64 --platform manylinux1_x86_64 -d .whl \
  keras namex optree ray optuna alembic sqlalchemy colorlog mako greenlet \
  pydantic pydantic-core annotated-types typing-inspection orjson mlxtend mlperf-logging
python3 - <<'PY'
"""Ray's wheel without ray/jars/: rewritten in place, its RECORD left out (pip installs without it)."""
import pathlib
import zipfile

for wheel in pathlib.Path(".whl").glob("ray-*.whl"):
    slim = wheel.with_suffix(".slim")
    with zipfile.ZipFile(wheel) as src, zipfile.ZipFile(slim, "w", zipfile.ZIP_DEFLATED) as dst:
        for item in src.infolist():
            if "/jars/" in item.filename or item.filename.endswith(".dist-info/RECORD"):
                continue
            dst.writestr(item, src.read(item))
    slim.replace(wheel)
PY
du -sh .whl
