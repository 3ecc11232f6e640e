#!/usr/bin/env bash
# benchmarks/gpu_check.py on a lent GPU machine, which reaches no package registry.
#
#   bash benchmarks/gpu_check.sh wheels   # here, with PyPI: albumentations and the packages
#                                         # it needs that the GPU image lacks, into .whl/
#   bash benchmarks/gpu_check.sh [ARGS]   # there, with .whl carried: install them, then run
#                                         # gpu_check.py ARGS under `timeout`
#
# The GPU image has Python 3.12 with torch, timm, einops, onnx, onnxruntime, numpy, scipy,
# opencv-python-headless and PyYAML, but not albumentations, which vision_tfm.train and
# vision_tfm.tasks import. The wheels below are pinned to the versions CI runs; .whl/ is
# git-ignored, so the device call names it: carry [".whl"], command
# `bash benchmarks/gpu_check.sh`, timeout_s 450 (the check stops itself at GPU_CHECK_TIMEOUT,
# 390 s, leaving time to copy $OUT back). Its JSON, Markdown and log land in $OUT (else
# benchmarks/out/).
set -uo pipefail
cd "$(dirname "$0")/.."

WHEELS=(
    albumentations==2.0.8 albucore==0.0.24 pydantic==2.13.4 pydantic-core==2.46.4
    annotated-types==0.7.0 typing-inspection==0.4.2 typing-extensions==4.16.0
    simsimd==6.5.16 stringzilla==5.3.2
)

if [[ "${1:-}" == "wheels" ]]; then
    python3 -m pip download --no-deps --only-binary=:all: --python-version "${PY_VERSION:-3.12}" \
        --implementation cp --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 \
        --platform manylinux_2_17_x86_64 --platform manylinux2014_x86_64 -d .whl "${WHEELS[@]}"
    exit
fi

if ! python3 -c "import albumentations" 2>/dev/null; then
    ls .whl/*.whl >/dev/null 2>&1 || { echo "no .whl/: run 'bash $0 wheels' first, carry .whl"; exit 2; }
    # --target: the image's own packages stay as they are; these only add to them
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade \
        --target /tmp/site .whl/*.whl || exit 2
    export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
python3 -c "import albumentations" || { echo "albumentations does not import"; exit 2; }
out=${OUT:-benchmarks/out}
mkdir -p "$out"
nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader 2>&1 | tee "$out/gpu.txt"
timeout "${GPU_CHECK_TIMEOUT:-390}" python3 benchmarks/gpu_check.py --out "$out" "$@" 2>&1 \
    | tee "$out/gpu_check.log"
