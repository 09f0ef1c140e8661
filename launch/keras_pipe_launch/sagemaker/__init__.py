"""Talking to SageMaker: the training job's request (request) and a tuning job's (tuning), sent
through the installed SDK, v3 or v2 (sdk), and followed to their end (follow)."""
