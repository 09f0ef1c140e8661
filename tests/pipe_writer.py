"""A Pipe-mode channel's writer, as SageMaker is one: for each pass N it makes the FIFO
DIR/CHANNEL_N, waits for the job to open it, writes the files into it (each wrapped as one RecordIO
record with --record-wrapper RecordIO), closes it, and goes on to the next pass. A reader that
closes early ends its pass. The tests of the reader and the job run it as a real process; it uses
nothing of this project but the reader's RecordIO encoder (the launcher has its own feeder, tested
with the launcher), so that the reader's tests run with the reader alone.

    python tests/pipe_writer.py --dir JOB/input/data --channel train [--passes N] FILE...

--chunk-bytes and --pause make a slow writer; --die-after-bytes one that dies (SIGKILL) in the middle;
--hold-pass N one that, once the job has opened pass N's FIFO, prints "holding CHANNEL_N" and writes
nothing more until it is killed (a test then knows that the job waits for that pass's data).
"""

from __future__ import annotations

import argparse
import errno
import os
import signal
import sys
import time


def pieces(data: bytes, size: int):
    for start in range(0, len(data), size or max(len(data), 1)):
        yield data[start:start + (size or len(data))]


def write_all(fifo, data: bytes) -> None:
    view = memoryview(data)
    while view:
        view = view[fifo.write(view):]  # (an unbuffered write may take part of it)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("files", nargs="+")
    parser.add_argument("--dir", required=True)
    parser.add_argument("--channel", required=True)
    parser.add_argument("--passes", type=int, default=None, help="default: until killed")
    parser.add_argument("--record-wrapper", choices=("None", "RecordIO"), default="None")
    parser.add_argument("--chunk-bytes", type=int, default=0)
    parser.add_argument("--pause", type=float, default=0.0)
    parser.add_argument("--die-after-bytes", type=int, default=None)
    parser.add_argument("--hold-pass", type=int, default=None)
    args = parser.parse_args(argv)
    objects = []
    for name in args.files:
        with open(name, "rb") as f:
            data = f.read()
        if args.record_wrapper == "RecordIO":
            from pipemode import recordio

            data = recordio.encode_record(data)
        objects.append(data)
    written, number = 0, 0
    while args.passes is None or number < args.passes:
        path = os.path.join(args.dir, f"{args.channel}_{number}")
        if not os.path.exists(path):
            os.mkfifo(path)
        with open(path, "wb", buffering=0) as fifo:  # blocks until the job opens it
            if number == args.hold_pass:
                print(f"holding {args.channel}_{number}", flush=True)
                signal.pause()  # (until killed)
            try:
                for data in objects:
                    for piece in pieces(data, args.chunk_bytes):
                        if args.die_after_bytes is not None and written + len(piece) >= args.die_after_bytes:
                            write_all(fifo, piece[:args.die_after_bytes - written])
                            os.kill(os.getpid(), signal.SIGKILL)  # die like a crashed writer
                        write_all(fifo, piece)
                        written += len(piece)
                        if args.pause:
                            time.sleep(args.pause)
            except BrokenPipeError:
                pass  # the job closed its end: this pass is over
            except OSError as err:
                if err.errno != errno.EPIPE:
                    raise
        number += 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
