"""The training container's entry point: read the SageMaker contract, validate, train, report.

Every failure, of any kind, ends here: /opt/ml/output/failure is written and the exit code says
what kind it was (see failure.EXIT_CODES).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import signal
import sys
import threading

STOPPED_EXIT_CODE = 143  # 128 + SIGTERM, as if the signal had ended the process


def on_sigterm(stop: threading.Event):
    """StopTrainingJob and spot interruptions send SIGTERM, then SIGKILL 120 s later: ask the
    training loop to stop after its current step and save a checkpoint, well within that."""

    def handler(signum, frame):
        logging.getLogger("train").warning(
            "SIGTERM received: stopping after the current step and saving a checkpoint")
        stop.set()

    return handler


def main() -> int:
    logging.basicConfig(level=logging.INFO, stream=sys.stdout, force=True,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from train import contract, failure

    layout = contract.paths()
    log = logging.getLogger("train")
    stop = threading.Event()
    signal.signal(signal.SIGTERM, on_sigterm(stop))
    try:
        from train.config import JobConfig

        config = JobConfig.from_hyperparameters(contract.read_hyperparameters(layout.hyperparameters))
        channels = contract.read_input_data_config(layout.input_config)
        resources = contract.read_resource_config(layout.resource_config)
        log.info("job %s on %s: %s", contract.training_job_name(), resources.current_host,
                 ", ".join(f"{k}={v}" for k, v in dataclasses.asdict(config).items()))
        log.info("channels: %s", ", ".join(f"{c.name} ({c.input_mode})" for c in channels.values()))

        from train import job  # TensorFlow loads here, after the cheap checks
        from train.loop import Stopped

        try:
            final = job.run(config, layout, channels, resources, stop)
        except Stopped as stopped:  # not a failure: no failure file
            log.warning("%s", stopped)
            return STOPPED_EXIT_CODE
    except BaseException as err:  # noqa: BLE001 - the one place every failure is reported
        return failure.report(err, layout.failure)
    log.info("training complete: %s", ", ".join(f"{k}={v}" for k, v in final.items()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
