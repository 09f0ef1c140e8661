"""pipemode against AWS's PipeModeDataset (the C++ op, TF 2.14), side by side in one run.

    bash bench/aws/setup.sh              # once: AWS's reader in its own venv, 2.2 GB of TFRecords
    python -m bench.vs_aws [--runs 5]    # from the repository root, with .venv (or: make bench-aws)

Each run is bench/aws/read_fifo.py: one pass over a TFRecord file streamed through a FIFO by `cat`,
batches of 1024 consumed inside tf.data, CRC checks on for pipemode, tf.data's autotuning off
(`--autotune` leaves it on; read_fifo.py says why it is off). For 100 KB, 1 KB and 100 B records,
interleaved, `--runs` times each:
  AWS                 sagemaker_tensorflow.PipeModeDataset(...).batch(1024)
  pipemode batched    PipeModeDataset(..., batch_size=1024)     (the fast path)
  pipemode drop-in    PipeModeDataset(...).batch(1024)          (used exactly as AWS's is)
Each runs in a bare virtualenv that setup.sh makes: AWS's in a TF 2.14 one, pipemode (from
train/pipemode) in a TF 2.21 one (tensorflow-cpu, google-crc32c). Prints the median time of each and
its fastest and slowest run (single runs vary by 20 % and more here, AWS's too), its speed
relative to AWS's median (>1: faster), the median peak RSS of each whole process (ru_maxrss of
the child) and that peak less the RSS of importing TensorFlow alone in the same venv (TF 2.21's
import alone takes ~120 MB more than 2.14's), and the median CPU seconds of the process and its
writer (TensorFlow's import included: ~2.3 s for 2.14, ~2.6 s for 2.21). pipemode runs with its
compiled framing where `make venv` built it (the first line says which decoder ran);
`--pure-python` runs it without.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
from pathlib import Path

from pipemode import tfrecord

REPO = Path(__file__).resolve().parent.parent
HARNESS = REPO / "bench" / "aws"
DATA = Path(os.environ.get("ANCHOR_DIR", Path.home() / ".cache" / "anchors"))
FILES = {"100 KB": "big_100k", "1 KB": "small_1k", "100 B": "tiny_100"}
READERS = ("AWS", "pipemode batched", "pipemode drop-in")
TARGETS = {  # issue 14: speed relative to AWS's op
    ("100 KB", "pipemode batched"): 1.2, ("1 KB", "pipemode batched"): 2.0,
    ("100 KB", "pipemode drop-in"): 1.0, ("1 KB", "pipemode drop-in"): 1.3,
}


def command(reader: str, data: Path, autotune: bool) -> list[str]:
    # pipemode from its source folder, in the bare TF 2.21 venv (tensorflow-cpu and google-crc32c):
    # the environment a user's script has. (This project's .venv would do too, but there
    # TensorFlow's import also loads pandas, scipy and matplotlib, installed for the launcher's
    # tools: 170 MB more RSS that no reader causes.)
    script = str(HARNESS / "read_fifo.py")
    if reader == "AWS":
        cmd = [str(DATA / "pmd" / "bin" / "python"), script, "aws", str(data)]
    else:
        mode = "batched" if reader.endswith("batched") else "drop-in"
        cmd = [str(DATA / "tfv" / "bin" / "python"), script, "pipemode", str(data), mode,
               str(REPO / "train" / "pipemode")]
    return cmd + (["--autotune"] if autotune else [])


def run(cmd: list[str]) -> tuple[float, float, float]:
    """(seconds the harness measured, peak RSS of the process in MB, CPU seconds of the process
    and its writer, TensorFlow's import included)."""
    env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2"}
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env)
    out, err = proc.stdout.read(), proc.stderr.read()
    _, status, usage = os.wait4(proc.pid, 0)
    proc.returncode = os.waitstatus_to_exitcode(status)
    lines = out.decode().strip().splitlines()
    if proc.returncode or not lines:
        sys.exit(f"failed: {' '.join(cmd)}\n{err.decode()[-2000:]}")
    return json.loads(lines[-1])["seconds"], usage.ru_maxrss / 1024, usage.ru_utime + usage.ru_stime


def decoder_path() -> str:
    """Which TFRecord decoder the pipemode runs use. They import pipemode from its source folder,
    where the editable install (`make venv`) built the compiled part: the one this process imports
    too (pipemode.tfrecord imports without TensorFlow)."""
    framing = tfrecord.compiled_framing()
    if framing is not None:
        return f"compiled ({Path(framing.__file__).name})"
    built = tfrecord._framing is not None
    return f"pure Python ({f'{tfrecord.PURE_PYTHON_ENV}=1' if built else 'pipemode._framing is not built'})"


def import_rss(python: Path) -> float:
    """Peak RSS in MB of importing TensorFlow (and running one op) in that venv: the floor."""
    script = "import tensorflow as tf; tf.constant(1) + 1"
    return run([str(python), "-c", script + "; import json; print(json.dumps({'seconds': 0}))"])[1]


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=5, help="runs of each reader per size (median)")
    parser.add_argument("--sizes", nargs="+", default=list(FILES), choices=list(FILES))
    parser.add_argument("--autotune", action="store_true",
                        help="leave tf.data's autotuning on (quantized times: see bench/aws/read_fifo.py)")
    parser.add_argument("--pure-python", action="store_true",
                        help="run pipemode without its compiled framing (PIPEMODE_PURE_PYTHON=1)")
    args = parser.parse_args(argv)
    if args.pure_python:
        os.environ[tfrecord.PURE_PYTHON_ENV] = "1"
    print(f"pipemode's TFRecord decoder: {decoder_path()}")
    missing = [p for p in [DATA / "pmd" / "bin" / "python", DATA / "tfv" / "bin" / "python",
                           *(DATA / f"{FILES[s]}.tfrecord" for s in args.sizes)] if not p.exists()]
    if missing:
        print(f"missing {', '.join(map(str, missing))}: run `bash bench/aws/setup.sh` once", file=sys.stderr)
        return 2
    return compare(args.sizes, args.runs, args.autotune)


def compare(sizes: list[str], runs: int, autotune: bool) -> int:
    floor = {"AWS": import_rss(DATA / "pmd" / "bin" / "python")}
    floor["pipemode batched"] = floor["pipemode drop-in"] = import_rss(DATA / "tfv" / "bin" / "python")
    print(f"importing TensorFlow alone: {floor['AWS']:.0f} MB (2.14, AWS's venv), "
          f"{floor['pipemode batched']:.0f} MB (2.21, pipemode's venv)")
    print(f"{'records':8} {'reader':18} {'median s':>9} {'range s':>11} {'vs AWS':>7} {'target':>7} "
          f"{'peak RSS':>9} {'above import':>12} {'CPU s':>6}")
    for size in sizes:
        data = DATA / f"{FILES[size]}.tfrecord"
        subprocess.run(["cat", str(data)], stdout=subprocess.DEVNULL, check=True)  # page cache
        seconds = {r: [] for r in READERS}
        rss = {r: [] for r in READERS}
        cpu = {r: [] for r in READERS}
        for _ in range(runs):  # interleaved: the machine's drift hits every reader alike
            for reader in READERS:
                s, m, c = run(command(reader, data, autotune))
                seconds[reader].append(s)
                rss[reader].append(m)
                cpu[reader].append(c)
        aws = statistics.median(seconds["AWS"])
        for reader in READERS:
            median = statistics.median(seconds[reader])
            target = TARGETS.get((size, reader))
            peak = statistics.median(rss[reader])
            spread = f"{min(seconds[reader]):.2f}-{max(seconds[reader]):.2f}"
            print(f"{size:8} {reader:18} {median:9.2f} {spread:>11} {aws / median:6.2f}x "
                  f"{f'>={target}x' if target else '':>7} {peak:6.0f} MB {peak - floor[reader]:9.0f} MB "
                  f"{statistics.median(cpu[reader]):6.2f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
