"""The launcher: `keras-pipe local | prepare | submit | tune`, run on your machine.

One subpackage per program, the command line on top, shared pieces below; imports point down only
(tests/launcher/test_import_layers.py checks it):

    cli/        the `keras-pipe` command: each command's options, messages and exit codes
    demo/       `make demo`: the whole path, offline, on the built-in digits
    prepare/    images to TFRecord shards: on this machine, or as a SageMaker Processing job
    local/      a training job on this machine, laid out and fed as SageMaker does, Pipe mode included
    sagemaker/  the training and tuning requests, the SDK v3 and v2 adapters, following a job
    sample_data/  the built-in digits (demo, tests, docs)
    common/     what several programs share: channels, object stores, /opt/ml config files,
                hyperparameters, processes and container engines, secrets, usage errors
"""
