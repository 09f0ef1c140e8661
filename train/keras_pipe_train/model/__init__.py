"""The network the job trains and exports:

    classifier   a Keras application backbone (or a ResNet of resnets) and a new head, built, loaded
                 from weights files, frozen and unfrozen for each phase
    resnets      MXNet's ResNet depths that Keras has no application for, built from plain layers
    incremental  a previous job's model, from a `model` channel, continued
    starting_point  what the model starts from: a previous model, JumpStart's, or the backbone's weights
    export       the TF Serving SavedModel and its serving signature (which decodes as sources/ does)
    explain      where a classifier looked: Grad-CAM (or Integrated Gradients) heatmaps, and the
                 randomised copy their sanity check compares them with

`python -m keras_pipe_train.model --download-imagenet NAMES` bakes ImageNet weights into the image.
It imports settings/ and sources/ (the export decodes images as training does); nothing of training/
beside it or report/ above.
"""
