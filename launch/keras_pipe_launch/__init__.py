"""The launcher side: local runs, SageMaker submission, data preparation."""
