"""The training job that runs inside the image (`train`): `python -m keras_pipe_train.main`.

One subpackage per part of the job; imports point down only, and a part imports nothing from a
part beside it (tests/launcher/test_import_layers.py checks both):

    main.py     the entry point: read the SageMaker contract, validate, train, report any failure
    job.py      the job itself: set up, the training phases, the export, the steps after training
    after_training/  those steps: calibration, evaluation, the label check, the report page
    report/     what a person reads after the job: the final evaluation, the gallery of mistakes,
                report.html and its HTML pieces, TensorBoard's pictures, untrusted text as shown
    training/   how the model learns: the loop, the recipe (optimizer, schedule, loss), tasks,
                early stopping, checkpoints and resume, distribution, metrics, precise BatchNorm,
                the devices' policy
    model/      the network: Keras backbones and the ResNets built here, the classifier around
                them, incremental training from a previous model, the export for serving
    sources/    the data: each channel's readers, the input pipeline, image checks, preprocessing
                and augmentation, the images kept for precise BatchNorm
    settings/   what the job is told and how it answers: hyperparameters and their dialects, the
                channels, the backbones' table, the SageMaker contract (/opt/ml), errors and the
                failure file

The reader, `pipemode`, is a distribution of its own, below all of them.
"""
