"""The training container's entry point: read the SageMaker contract, validate, train, report.

Every failure, of any kind, ends here: /opt/ml/output/failure is written and the exit code says
what kind it was (see failure.EXIT_CODES).
"""

from __future__ import annotations

import logging
import os
import signal
import sys
import threading

STOPPED_EXIT_CODE = 143  # 128 + SIGTERM, as if the signal had ended the process


def stop_on_sigterm(stop: threading.Event) -> None:
    """StopTrainingJob and spot interruptions send SIGTERM, then SIGKILL 120 s later: `stop` asks
    the training loop to stop after its current step and save a checkpoint, well within that.

    A Python signal handler runs only when the main thread runs Python, and the main thread spends
    its time inside TensorFlow (a training step, or a wait for the next batch while SageMaker has
    not yet written the FIFO). So the signal is also seen through a wakeup file descriptor, which
    the C-level handler writes to at once, by a thread that sets `stop` right away: the Pipe
    reader's waits end on it, and the loop stops at the next step boundary."""
    read_end, write_end = os.pipe()
    os.set_blocking(write_end, False)
    signal.set_wakeup_fd(write_end, warn_on_full_buffer=False)
    signal.signal(signal.SIGTERM, lambda signum, frame: request_stop(stop))  # replaces the default: exit

    def watch() -> None:
        while True:
            if signal.SIGTERM in os.read(read_end, 256):
                request_stop(stop)

    threading.Thread(target=watch, name="sigterm", daemon=True).start()


def request_stop(stop: threading.Event) -> None:
    if not stop.is_set():
        stop.set()
        logging.getLogger("train").warning(
            "SIGTERM received: stopping after the current step and saving a checkpoint")


USAGE = """usage: train  (also installed as keras-pipe-train)

What SageMaker runs in the training image (`docker run IMAGE train`). It takes no arguments: the
job reads its settings from SageMaker's container contract under /opt/ml, or $SAGEMAKER_BASE_DIR
when set:
  input/config/hyperparameters.json   the hyperparameters (every value a string)
  input/config/inputdataconfig.json   the channels and their input modes
  input/config/resourceconfig.json    this host and the job's hosts
  input/data/<channel>/ or <channel>_<N>   the data: File/FastFile folders, Pipe-mode FIFOs
It writes model/ (the exported model), output/data/metrics.json, checkpoints/, and on failure
output/failure with exit code 2 (configuration), 3 (data), 4 (cluster) or 1 (a bug); 143 when
stopped by SIGTERM. To run a job on this machine, use `keras-pipe local` (it lays out /opt/ml);
the hyperparameters are defined in train/keras_pipe_train/settings/hyperparameters.py and listed in docs/job.md.
"""


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if any(arg in ("-h", "--help") for arg in argv):
        print(USAGE, end="")
        return 0
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from keras_pipe_train.settings import contract, cpu_kernels, failure
    from pipemode import allocator

    allocator.keep_record_memory()

    layout = contract.paths()
    log = logging.getLogger("train")
    stop = threading.Event()
    stop_on_sigterm(stop)
    try:
        if argv:  # (SageMaker passes none; AlgorithmSpecification.ContainerArguments would)
            from keras_pipe_train.settings.errors import UserError

            raise UserError(f"train takes no arguments, got {' '.join(argv)!r}: the job reads its settings "
                            "from /opt/ml/input/config (train --help says more)")
        config, channels, resources = read_job(layout, log)
        # (before TensorFlow is imported: it reads the choice then)
        # (a preset chooses the backbone later, never the small one: None)
        backbone = config.backbone if config.preset == "none" or "backbone" in config.given else None
        log.info("%s", cpu_kernels.choose(backbone=backbone, image_size=config.image_size))

        from keras_pipe_train.settings import paused_collector, unneeded_imports

        unneeded_imports.skip_unneeded_imports()
        paused_collector.pause_collector_while_tensorflow_imports()
        from keras_pipe_train import job  # TensorFlow loads here, after the cheap checks
        from keras_pipe_train.training.loop import Stopped

        try:
            final = job.run(config, layout, channels, resources, stop)
        except Stopped as stopped:  # not a failure: no failure file
            log.warning("%s", stopped)
            return STOPPED_EXIT_CODE
    except BaseException as err:  # the one place every failure is reported
        return failure.report(err, layout.failure)
    log.info("training complete: %s", ", ".join(f"{k}={v}" for k, v in final.items()))
    return 0


def read_job(layout, log: logging.Logger) -> tuple:
    """(the job's settings, its channels, its hosts) from /opt/ml/input/config, each checked, and said
    in the log: the cheap checks, before TensorFlow loads."""
    from keras_pipe_train.settings import contract
    from keras_pipe_train.settings.config import JobConfig
    from keras_pipe_train.sources import content_types, lst
    from keras_pipe_train.sources.class_folders import with_folder_classes

    hyperparameters = contract.read_hyperparameters(layout.hyperparameters)
    channels = contract.channels_by_role(contract.read_input_data_config(layout.input_config))
    resources = contract.read_resource_config(layout.resource_config)
    # (a request in the built-in MXNet algorithm's dialect: its channels' ContentType says the format)
    decided = content_types.from_channels(hyperparameters, channels)
    config = JobConfig.from_hyperparameters(with_folder_classes(decided.hyperparameters, layout, channels, resources),
                                            hosts=len(resources.hosts))
    for note in config.dialect_notes:
        log.info("%s", note)
    if decided.note:
        log.info("%s", decided.note)
    if config.record_format == "lst":
        lst.check_channels(channels, len(resources.hosts))
    log.info("job %s on %s: %s", contract.training_job_name(), resources.current_host, config.settings())
    log.info("channels: %s", ", ".join(f"{c.name} ({c.input_mode})" + (f" as {role}" if role != c.name else "")
                                       for role, c in channels.items()))
    return config, channels, resources


def run() -> None:
    """The `train` program (container/train, the `keras-pipe-train` command): runs the job, then
    leaves without the interpreter's finalization. By then the failure file, checkpoints and model
    are written, and finalizing can deadlock against TensorFlow's own threads (a tf.data thread
    still in Python code, tensorflow/tensorflow#22632): a job that hangs after its work is done
    bills GPUs until MaxRuntimeInSeconds."""
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    run()
