"""Images to the TFRecord shards the job reads: where images come from (sources), the checks and
shrinking of each (images), the dataset on one machine (dataset) and its upload (upload); at scale,
the plan all instances share (plan), the Processing job (processing) and each instance (instance)."""
