"""A container engine whose "image" is hostile: `LAUNCH_ENGINE="python hostile_engine.py"` runs
`ENGINE run ... -v DIR:/opt/ml ... IMAGE -- python3 -m MODULE ARGS` as the real engine would (the
module as a process, with DIR as its /opt/ml), then does what the image's name says to what the
instance leaves behind, as code in a container could:

    link-file:TARGET      a symbolic link processing/output/train/stolen -> TARGET
    link-folder:TARGET    processing/output itself replaced by a link to the folder TARGET
    extra-file:PATH       a file processing/output/PATH (its plan, another host's report ...)
    zero-message          output/message linked to /dev/zero, and exit 1 (the instance not run)
    fifo-message          output/message a FIFO nobody writes, and exit 1 (the instance not run)
    drop-bucket:NAME      the S3 bucket NAME emptied and removed (where the output was to go)
    hold                  nothing done to what it leaves, but the "container" does not end with the
                          instance: it says "hold: ..." and waits to be stopped (SIGTERM, exit 143),
                          so that a test stops a run whose instances are surely still running
"""

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path


def main(argv: list[str]) -> int:
    assert argv[0] == "run", argv
    mount = argv[argv.index("-v") + 1]
    base = Path(mount.rsplit(":", 1)[0])
    separator = argv.index("--")  # (tini's): the image's name is just before it
    image, command = argv[separator - 1], argv[separator + 1:]
    assert command[:2] == ["python3", "-m"], command
    act, _, target = image.partition(":")
    if act in ("zero-message", "fifo-message"):  # (it fails whatever the instance did: none is run, CI's time)
        return leave_a_message(base, act)
    env = {**os.environ, "SAGEMAKER_BASE_DIR": str(base)}
    instance = subprocess.Popen([sys.executable, *command[1:]], env=env)
    # a stop reaches the instance, as `docker run` passes signals on to the container
    signal.signal(signal.SIGTERM, lambda signum, frame: instance.send_signal(signum))
    code = instance.wait()
    if act == "hold":
        stopped = threading.Event()
        signal.signal(signal.SIGTERM, lambda signum, frame: stopped.set())
        print(f"hold: the instance exited with code {code}; held until stopped", flush=True)
        while not stopped.wait(0.1):
            pass
        return 128 + signal.SIGTERM
    output = base / "processing" / "output"
    if act == "link-file":
        (output / "train").mkdir(parents=True, exist_ok=True)
        (output / "train" / "stolen").symlink_to(target)
    elif act == "link-folder":
        output.rename(output.with_name("output-real"))
        output.symlink_to(target, target_is_directory=True)
    elif act == "extra-file":
        (output / target).parent.mkdir(parents=True, exist_ok=True)
        (output / target).write_bytes(b"planted by the container")
    elif act == "drop-bucket":
        import boto3

        bucket = boto3.resource("s3").Bucket(target)
        bucket.objects.all().delete()
        bucket.delete()
    return code


def leave_a_message(base: Path, act: str) -> int:
    """output/message that must never be read whole or waited on, and the exit code of a failure."""
    (base / "output").mkdir(parents=True, exist_ok=True)
    (base / "output" / "message").unlink(missing_ok=True)
    if act == "zero-message":
        (base / "output" / "message").symlink_to("/dev/zero")
    else:
        os.mkfifo(base / "output" / "message")
    return 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
