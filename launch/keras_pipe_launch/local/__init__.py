"""A training job on this machine, as SageMaker runs it: each host's /opt/ml laid out (layout), its
Pipe channels fed through FIFOs (feeder), its processes or containers run (run), and its job folder
kept for resuming (job_folder)."""
