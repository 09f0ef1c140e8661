"""The data the job reads, one module per source, each turning a channel's files or streamed
records into the job's one form, a tf.train.Example of an encoded image and its label(s)
(`example`): prepared TFRecords (`example`), class folders (`class_folders`), MXNet RecordIO image
files (`mxnet_records`), images listed by MXNet .lst files (`lst`), and Ground Truth's augmented
manifests (`manifest`, their labels read by `manifest_labels`, which the launcher's prepare shares).
`keras_pipe_train.datasets` picks one per channel; these import nothing of the job above them (the
training loop, the export)."""
