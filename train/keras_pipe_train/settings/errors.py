"""The kinds of error a training job can end with.

SageMaker shows the first 1024 characters of /opt/ml/output/failure as the job's FailureReason,
so every error raised on purpose says what went wrong, where, and how to fix it. The kind tells
the top-level handler whether the user must act (configuration, data) or whether it is a bug in
this project (anything that is not a JobError).
"""


class JobError(Exception):
    """An anticipated failure, explained in its message; `kind` is the failure kind it reports
    as (keras_pipe_train.settings.failure.EXIT_CODES)."""

    kind = "internal error"


class UserError(JobError):
    """The job's configuration is wrong: hyperparameters, channels, paths, arguments."""

    kind = "configuration error"


class DataError(JobError):
    """The input data is missing, corrupt or incomplete."""

    kind = "data error"


class ClusterError(JobError):
    """The hosts of a multi-host job lost each other, or one of them failed."""

    kind = "cluster error"
