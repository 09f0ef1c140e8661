#!/usr/bin/env bash
# Builds what `make bench-aws` (python -m bench.vs_aws) compares pipemode against, once, under
# $ANCHOR_DIR (default ~/.cache/anchors); downloads ~1 GB of wheels and writes 2.2 GB of TFRecords:
#   pmd/  Python 3.10 + tensorflow-cpu 2.14.1 + AWS's sagemaker-tensorflow 2.14 (PipeModeDataset,
#         the C++ op: AWS built it for TF <= 2.14 and Python <= 3.10 only)
#   tfv/  Python 3.11 + tensorflow-cpu 2.21.0 + google-crc32c: a bare environment for pipemode,
#         which runs from this checkout's train/pipemode (what a user's script has, nothing more)
#   big_100k.tfrecord, small_1k.tfrecord, tiny_100.tfrecord: 10,000 x 100 KB, 1,000,000 x 1 KB and
#         2,000,000 x 100 B records
# Python 3.10: python3.10 on PATH, or PYTHON310=/path/to/python3.10 (pyenv install 3.10 makes one).
set -euo pipefail
HERE=$(cd "$(dirname "$0")" && pwd)
A=${ANCHOR_DIR:-$HOME/.cache/anchors}
mkdir -p "$A/dl"
if [ ! -x "$A/pmd/bin/python" ]; then
  PY310=${PYTHON310:-}
  if [ -z "$PY310" ]; then  # (a pyenv shim may exist for a version that is not selected: try each)
    for candidate in python3.10 $(ls -d "$(pyenv root 2> /dev/null || echo /nonexistent)"/versions/3.10.*/bin/python3.10 2> /dev/null); do
      if "$candidate" -c 1 2> /dev/null; then PY310=$candidate; break; fi
    done
  fi
  [ -n "$PY310" ] || { echo "setup: AWS's op needs Python 3.10: install it or set PYTHON310" >&2; exit 1; }
  "$PY310" -m venv "$A/pmd"
  # sagemaker-tensorflow's wheels are per TensorFlow version; 2.14.0.1.20.0 is its last, for TF 2.14
  "$A/pmd/bin/pip" download -q --no-deps --only-binary=:all: --python-version 3.10 \
    --platform manylinux1_x86_64 -d "$A/dl" sagemaker-tensorflow==2.14.0.1.20.0
  "$A/pmd/bin/pip" install -q tensorflow-cpu==2.14.1 "$A"/dl/sagemaker_tensorflow-2.14.0.1.20.0-cp310-*.whl
fi
if [ ! -x "$A/tfv/bin/python" ]; then
  python3.11 -m venv "$A/tfv"
  "$A/tfv/bin/pip" install -q tensorflow-cpu==2.21.0 google-crc32c numpy
fi
for spec in "big_100k 10000 100000" "small_1k 1000000 1000" "tiny_100 2000000 100"; do
  set -- $spec
  [ -f "$A/$1.tfrecord" ] || "$A/tfv/bin/python" "$HERE/make_records.py" "$A/$1.tfrecord" "$2" "$3"
done
echo "$A"
