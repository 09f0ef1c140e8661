"""The requests of AWS's sample notebooks for SageMaker's built-in image classifiers, as the tests'
spec: each notebook's hyperparameters exactly as it sends them (strings where it sends strings,
numbers where the SDK's set_hyperparameters takes numbers and sends str() of them), with only the
dataset's own counts (num_classes, num_training_samples) given by the test's data.

Sources: aws/amazon-sagemaker-examples at 4883224d0032906f1a2bafd4887544ff5ddae606, the last commit
before introduction_to_amazon_algorithms/imageclassification_* were removed:
  MXNET_FULL_TRAINING    imageclassification_caltech/Image-classification-fulltraining.ipynb, cells 13, 15
  MXNET_LST_FORMAT       imageclassification_caltech/Image-classification-lst-format.ipynb, cells 21, 23
  MXNET_INCREMENTAL      imageclassification_caltech/Image-classification-incremental-training-highlevel.ipynb,
                         cell 18 (the first job) and incr_ic.set_hyperparameters (the job continued from it)
  MXNET_MULTI_LABEL      imageclassification_mscoco_multi_label/Image-classification-multilabel-lst.ipynb, cell 25
  MXNET_GROUND_TRUTH     ground_truth_labeling_jobs/from_unlabeled_data_to_deployed_machine_learning_model_
                         ground_truth_demo_image_classification/...ipynb, cell 45 (augmented manifest, Pipe mode)
and for the TensorFlow algorithm, what JumpStart's `hyperparameters.retrieve_default` returns
(aws/sagemaker-python-sdk v2.257.6, tests/unit/sagemaker/jumpstart/constants.py, the one TF image
classification spec it holds: every value str() of its default), which
introduction_to_amazon_algorithms/image_classification_tensorflow/Amazon_TensorFlow_Image_Classification.ipynb
sends whole after `hyperparameters["epochs"] = "5"`.
"""

from __future__ import annotations


def mxnet_full_training(num_classes: int, num_training_samples: int) -> dict:
    num_layers = "18"
    image_shape = "3,224,224"
    mini_batch_size = "64"
    epochs = "2"
    learning_rate = "0.01"
    return {
        "image_shape": image_shape,
        "num_layers": str(num_layers),
        "num_training_samples": str(num_training_samples),
        "num_classes": str(num_classes),
        "mini_batch_size": str(mini_batch_size),
        "epochs": str(epochs),
        "learning_rate": str(learning_rate),
    }


def mxnet_lst_format(num_classes: int, num_training_samples: int) -> dict:
    num_layers = 18
    image_shape = "3,206,206"
    mini_batch_size = 128
    epochs = 6
    learning_rate = 0.01
    top_k = 5
    resize = 256
    checkpoint_frequency = 2
    use_pretrained_model = 1
    return {
        "image_shape": image_shape,
        "num_layers": str(num_layers),
        "num_training_samples": str(num_training_samples),
        "num_classes": str(num_classes),
        "mini_batch_size": str(mini_batch_size),
        "epochs": str(epochs),
        "learning_rate": str(learning_rate),
        "top_k": str(top_k),
        "resize": str(resize),
        "checkpoint_frequency": str(checkpoint_frequency),
        "use_pretrained_model": str(use_pretrained_model),
    }


def mxnet_incremental_values(num_classes: int, num_training_samples: int, continued: bool) -> dict:
    """What the notebook gives the SDK's set_hyperparameters(...) (cell 18; continued: its second job's)."""
    return dict(num_layers=18, image_shape="3,224,224", num_classes=num_classes,
                num_training_samples=num_training_samples, mini_batch_size=128 if continued else 256, epochs=2,
                learning_rate=0.01 if continued else 0.1, top_k=2)


def mxnet_incremental(num_classes: int, num_training_samples: int, continued: bool) -> dict:
    """The SDK's set_hyperparameters(...) as sent: every value str()."""
    values = mxnet_incremental_values(num_classes, num_training_samples, continued)
    return {name: str(value) for name, value in values.items()}


def mxnet_multi_label(num_classes: int, num_training_samples: int) -> dict:
    values = dict(num_layers=18, use_pretrained_model=1, image_shape="3,224,224", num_classes=num_classes,
                  mini_batch_size=128, resize=256, epochs=5, learning_rate=0.001,
                  num_training_samples=num_training_samples, use_weighted_loss=1,
                  augmentation_type="crop_color_transform", precision_dtype="float32", multi_label=1)
    return {name: str(value) for name, value in values.items()}


def mxnet_ground_truth(num_classes: int, num_training_samples: int) -> dict:
    return {
        "epochs": "30",
        "image_shape": "3,224,224",
        "learning_rate": "0.01",
        "lr_scheduler_step": "10,20",
        "mini_batch_size": "32",
        "num_classes": str(num_classes),
        "num_layers": "18",
        "num_training_samples": str(num_training_samples),
        "resize": "224",
        "use_pretrained_model": "1",
    }


def tensorflow_jumpstart_defaults() -> dict:
    hyperparameters = {
        "train_only_top_layer": "True",
        "epochs": "5",
        "batch_size": "32",
        "optimizer": "adam",
        "learning_rate": "0.001",
        "beta_1": "0.9",
        "beta_2": "0.999",
        "momentum": "0.9",
        "epsilon": "1e-07",
        "rho": "0.95",
        "initial_accumulator_value": "0.1",
        "reinitialize_top_layer": "Auto",
        "early_stopping": "False",
        "early_stopping_patience": "5",
        "early_stopping_min_delta": "0.0",
        "dropout_rate": "0.2",
        "regularizers_l2": "0.0001",
        "label_smoothing": "0.1",
        "image_resize_interpolation": "bilinear",
        "augmentation": "False",
        "augmentation_random_flip": "horizontal_and_vertical",
        "augmentation_random_rotation": "0.2",
        "augmentation_random_zoom": "0.1",
        "binary_mode": "False",
        "eval_metric": "accuracy",
        "validation_split_ratio": "0.2",
        "random_seed": "123",
    }
    hyperparameters["epochs"] = "5"  # (the notebook's one change)
    return hyperparameters
