"""How the model learns:

    loop               the training loop, steps_per_execution steps per call, on any tf.distribute strategy
    recipe             the optimizer, the learning rate at each step, what the loss adds up
    tasks              single- or multi-label: each batch's loss, and the counts its metrics come from
    early_stopping     when a phase stops improving, and which epoch's weights are kept
    checkpoints        /opt/ml/checkpoints: whose they are, saved each epoch, resumed to the record
    distribute         which tf.distribute strategy, from SageMaker's hosts and this one's GPUs
    metrics            the metric lines SageMaker's regexes catch, and metrics.json
    precise_batchnorm  BatchNorm statistics recomputed with each epoch's final weights
    phases             the head on a frozen backbone, then fine-tuning (or the whole network from scratch)
    resume             which checkpoints are this job's, and where a job goes on
    epoch_models       keep_epoch_models: every N-th epoch's model, kept for the export
    devices            mixed precision and steps per call, by the devices found
    traced             functions traced once for batches of any size

It imports settings/ and sources/: nothing of the model beside it (the job hands it the model it
built) or the report above.
"""
