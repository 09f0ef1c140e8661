# The SageMaker image: SageMaker runs `docker run IMAGE train` to train, and `docker run IMAGE serve`
# to host the exported model (an endpoint or a batch transform: port 8080, /ping, /invocations).
#
#   docker build -t keras-pipe-train .                      # GPU image (CUDA user-space from pip wheels)
#   docker build -t keras-pipe-train:cpu --build-arg REQUIREMENTS=requirements/cpu.txt .
#   docker build --build-arg BAKE_WEIGHTS=mobilenet_v3_small,resnet50 ...   # for network isolation
#
# Build arguments:
#   BASE_IMAGE    any Debian/Ubuntu image with apt (default: CUDA 12.8 on Ubuntu 24.04, Python 3.12).
#                 The NVIDIA driver comes from the host; CUDA/cuDNN libraries from the TensorFlow
#                 wheels (tensorflow[and-cuda]).
#   REQUIREMENTS  the pinned requirements file: requirements.txt (tensorflow[and-cuda], GPU) or
#                 requirements/cpu.txt (tensorflow-cpu, smaller: for CPU instances and tests)
#   BAKE_WEIGHTS  comma-separated backbones whose ImageNet weights to download into the image, so
#                 that weights=imagenet works in jobs without internet access (resnet18 and resnet34:
#                 MXNet Gluon's model zoo files, checked by SHA-1 and converted to Keras); keras-hub
#                 presets and handles (dinov2_small, hf://timm/...) are saved whole in /opt/keras/presets
ARG BASE_IMAGE=nvidia/cuda:12.8.0-base-ubuntu24.04

# The reader's compiled part (pipemode._framing: TFRecord framing and CRCs in C) is built here, in a
# stage of its own: the image keeps the wheel, not the compiler and Python's headers.
FROM ${BASE_IMAGE} AS reader-wheel
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-venv python3-dev gcc libc6-dev ca-certificates \
 && rm -rf /var/lib/apt/lists/*
COPY train/pipemode/ /src/pipemode/
RUN python3 -m venv /build \
 && /build/bin/pip wheel --no-cache-dir --disable-pip-version-check --no-deps --wheel-dir /wheels /src/pipemode \
 && ls /wheels/pipemode-*-cp3*-linux_*.whl  # (a py3-none-any wheel here would mean the C part did not build)

FROM ${BASE_IMAGE}

# tini runs as PID 1: the kernel does not deliver a default-action SIGTERM to PID 1, so without it
# a StopTrainingJob or spot interruption would not reach the job until SIGKILL.
RUN apt-get update \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
      python3 python3-venv ca-certificates tini \
 && rm -rf /var/lib/apt/lists/*

ENV VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/opt/program/container:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    KERAS_HOME=/opt/keras \
    TF_CPP_MIN_LOG_LEVEL=2

# Dependencies before code: a code change rebuilds only the last layers, in seconds.
ARG REQUIREMENTS=requirements.txt
COPY requirements.txt /opt/program/requirements.txt
COPY requirements/ /opt/program/requirements/
# (keras-hub without its declared dependencies: requirements/hub.txt says why)
RUN python3 -m venv /opt/venv \
 && pip install --no-cache-dir --disable-pip-version-check -r /opt/program/${REQUIREMENTS} \
 && pip install --no-cache-dir --disable-pip-version-check --no-deps -r /opt/program/requirements/hub.txt

# The reader (its wheel, built above with its compiled part) and the job, installed (not run from
# the source folder): their dependencies are already pinned above, hence --no-deps. The launcher too, for its prepare code: a Processing job
# (`keras-pipe prepare --instance-count N`) runs `python3 -m keras_pipe_launch.prepare.instance`
# here; what that imports (Pillow, tqdm, ImageHash) is in requirements/base.txt. An instance reads only its
# /opt/ml, so neither boto3 nor the SageMaker SDK the rest of the launcher wants is in the image.
COPY --from=reader-wheel /wheels/ /tmp/wheels/
COPY train/ /opt/program/train/
COPY launch/ /opt/program/launch/
RUN pip install --no-cache-dir --disable-pip-version-check --no-deps /tmp/wheels/pipemode-*.whl /opt/program/train \
      /opt/program/launch \
 && rm -rf /opt/program/train /opt/program/launch /tmp/wheels
COPY container/ /opt/program/container/
WORKDIR /opt/program

ARG BAKE_WEIGHTS=""
# (keras-hub's downloads are cached outside the image's layers: each preset is kept once, saved in /opt/keras/presets)
RUN if [ -n "${BAKE_WEIGHTS}" ]; then KAGGLEHUB_CACHE=/tmp/hub-cache HF_HOME=/tmp/hub-cache \
      python3 -m keras_pipe_train.model --download-imagenet "${BAKE_WEIGHTS}" && rm -rf /tmp/hub-cache; fi

RUN mkdir -p /opt/ml/input/config /opt/ml/input/data /opt/ml/model /opt/ml/output/data /opt/ml/checkpoints \
 && python3 -c "import keras_pipe_train.main, keras_pipe_serve.server, gunicorn, pipemode._framing, google_crc32c, keras_pipe_launch.prepare.instance, keras_hub" \
 && test -x /opt/program/container/train && test -x /opt/program/container/serve

# SageMaker's hosting honours these labels: it may then set SAGEMAKER_BIND_TO_PORT (inference
# pipelines), and host the image on a multi-model endpoint (SAGEMAKER_MULTI_MODEL=true: keras_pipe_serve.models)
LABEL com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true \
      com.amazonaws.sagemaker.capabilities.multi-models=true
ENTRYPOINT ["/usr/bin/tini", "--"]
CMD ["train"]
