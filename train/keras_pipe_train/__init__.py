"""The training job that runs inside the image: Pipe reader, SageMaker contract, pipeline, model."""
