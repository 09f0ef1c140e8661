"""What the job is told and how it answers, read before anything is built, without TensorFlow:

    hyperparameters   each hyperparameter defined once: default, parser, bounds, help, tuning range, resumable
    parsers           how a hyperparameter's value reads, in every form SageMaker's clients send it
    config            the hyperparameters of a request read into one typed, validated JobConfig
    dialects          the hyperparameters of SageMaker's built-in image classifiers, read as they mean them
    backbones         the backbones a job can choose, and what each needs around it (model/ builds them)
    contract          SageMaker's container contract: /opt/ml, the channels, the resources
    channels          the job's channels: their names, what each holds, the modes each takes
    cpu_kernels       TensorFlow's CPU kernels (oneDNN's), chosen before TensorFlow is imported
    tracing           how the job's functions are traced into graphs: as written, without AutoGraph
    serving_schema    serving.json's typed, versioned schema (export writes it, serve and predict read it)
    errors            the kinds of error a job can end with
    failure           any failure as SageMaker reports it: /opt/ml/output/failure and the exit code
    unneeded_imports  Keras' optional imports, skipped by the job's, the server's and the launcher's processes
    first_import      a module's first import, run within a context (unneeded_imports', the launcher's quiet start)

The ground floor: it imports nothing of the job's (only the reader, pipemode), and every other part
of the job, the server and the launcher may import it.
"""
