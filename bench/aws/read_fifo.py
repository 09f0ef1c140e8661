"""One timed pass of a Pipe-mode reader over a TFRecord file streamed through a FIFO by `cat`:
batches of 1024 records consumed inside tf.data (`ds.reduce`: a Python loop per batch would time
the loop, not the reader). Prints one JSON line.

    python read_fifo.py aws FILE                    # AWS's sagemaker_tensorflow.PipeModeDataset, .batch(1024)
    python read_fifo.py pipemode FILE batched PATH  # pipemode from PATH (train/pipemode), batch_size=1024
    python read_fifo.py pipemode FILE drop-in PATH  # pipemode used exactly as AWS's: .batch(1024)
    ... --autotune                                  # leave tf.data's autotuning on

tf.data's autotuning is off unless --autotune: with it on, the reduce over a finished stream
returns only when tf.data's autotune thread next wakes (it sleeps 10 ms, then twice as long each
time), so every reader's times come out as 1.27, 2.55 or 5.11 s whatever its speed.
"""

import json
import os
import subprocess
import sys
import tempfile
import time

import tensorflow as tf

args = [a for a in sys.argv[1:] if a != "--autotune"]
reader, source, mode = args[0], args[1], (args[2] if len(args) > 2 else "drop-in")
root = tempfile.mkdtemp()
for folder in ("data", "config", "state"):
    os.makedirs(os.path.join(root, folder))
with open(os.path.join(root, "config", "inputdataconfig.json"), "w") as f:
    json.dump({"train": {"TrainingInputMode": "Pipe", "RecordWrapperType": "None"}}, f)
fifo = os.path.join(root, "data", "train_0")
os.mkfifo(fifo)
writer = subprocess.Popen(["sh", "-c", f'cat "{source}" > "{fifo}"'])
where = dict(pipe_dir=os.path.join(root, "data"), config_dir=os.path.join(root, "config"),
             state_dir=os.path.join(root, "state"))
if reader == "aws":
    from sagemaker_tensorflow import PipeModeDataset

    ds = PipeModeDataset("train", record_format="TFRecord", **where).batch(1024)
else:
    sys.path.insert(0, args[3])
    from pipemode import PipeModeDataset

    if mode == "batched":
        ds = PipeModeDataset("train", record_format="TFRecord", batch_size=1024, **where)
    else:
        ds = PipeModeDataset("train", record_format="TFRecord", **where).batch(1024)
ds = ds.prefetch(4)
if "--autotune" not in sys.argv:
    options = tf.data.Options()
    options.autotune.enabled = False
    ds = ds.with_options(options)
start = time.perf_counter()
count, size = ds.reduce((tf.constant(0, tf.int64), tf.constant(0, tf.int64)),
                        lambda acc, batch: (acc[0] + tf.size(batch, out_type=tf.int64),
                                            acc[1] + tf.reduce_sum(tf.cast(tf.strings.length(batch), tf.int64))))
seconds = time.perf_counter() - start
writer.wait()
print(json.dumps({"reader": f"{reader} {mode}", "records": int(count), "bytes": int(size),
                  "seconds": round(seconds, 3)}))
