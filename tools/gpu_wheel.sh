#!/usr/bin/env bash
# Bring PyPI's onnxruntime-gpu wheel to a GPU machine without network, in parts small enough for one transfer.
#
#   bash tools/gpu_wheel.sh fetch [.whl]   download the cp312 manylinux wheel (needs PyPI) and split it into
#                                          60 MiB parts NAME.part-00, -01, ... plus NAME.sha256; the wheel itself
#                                          is removed so that only the parts travel
#   bash tools/gpu_wheel.sh join [.whl]    on the GPU machine: put the parts back together and check the sha256
#                                          (tools/gpu_check.sh does this itself when it finds parts)
#
# .whl/ is git-ignored: send each part with its own call (carry it), back to back while the machine is warm,
# then run tools/gpu_check.sh. VERSION picks the release (default 1.31.1, a CUDA 13 build).
set -euo pipefail
cmd="${1:-}"
dir="${2:-.whl}"
VERSION="${VERSION:-1.31.1}"
case "$cmd" in
  fetch)
    mkdir -p "$dir"
    python3 -m pip download --quiet --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
        --platform manylinux_2_28_x86_64 --platform manylinux_2_27_x86_64 -d "$dir" "onnxruntime-gpu==$VERSION"
    for wheel in "$dir"/onnxruntime_gpu-*.whl; do
      (cd "$dir" && sha256sum "$(basename "$wheel")" > "$(basename "$wheel").sha256")
      split -b 60M -d "$wheel" "$wheel.part-"
      rm "$wheel"
    done
    ls -l "$dir"
    ;;
  join)
    for sum in "$dir"/*.whl.sha256; do
      wheel="${sum%.sha256}"
      if compgen -G "$wheel.part-*" > /dev/null; then
        cat "$wheel".part-* > "$wheel"
        (cd "$dir" && sha256sum -c "$(basename "$sum")") || { echo "parts of $wheel are incomplete or damaged"; exit 1; }
        rm "$wheel".part-*
      fi
    done
    ;;
  *)
    echo "usage: bash tools/gpu_wheel.sh fetch|join [DIR]" >&2
    exit 2
    ;;
esac
