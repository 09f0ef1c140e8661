"""The data the job reads, from a channel's files or streamed records to batches of images.

One module per source, each turning what a channel holds into the job's one form, a
tf.train.Example of an encoded image and its label(s) (`example`): prepared TFRecords (`example`),
class folders (`class_folders`), MXNet RecordIO image files (`mxnet_records`), images listed by
MXNet .lst files (`lst`), Ground Truth's augmented manifests (`manifest`, their labels read by
`manifest_labels`, which the launcher's prepare shares); `listed` is the pass that class folders and
.lst files share, and `content_types` reads which one a channel holds from its ContentType, as the
built-in algorithm does. Then what the pipeline does with them:

    datasets       the input pipeline: a channel's records, sharded, shuffled, batched, parsed, decoded
    images         what an image may be before anything decodes it (formats, size, whole or damaged)
    preprocess     decoding, resizing and augmentation, as small TensorFlow functions
    recent_images  the last images of a training pass, kept for precise BatchNorm
    image_record_header  MXNet's image record header (im2rec's), read by mxnet_records and the server

It imports only settings/ (and the reader, pipemode): nothing of the model, the training or the
report above it.
"""
