"""Serving the exported model as SageMaker hosts it (`serve`: GET /ping, POST /invocations), and
predictions from it here (`keras-pipe predict`)."""
