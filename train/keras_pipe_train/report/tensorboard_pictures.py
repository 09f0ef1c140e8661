"""The pictures of the job's end in TensorBoard, beside the epochs' scalars (job.EpochLog): the
confusion matrix (or each class's bars) and the worst mistakes of the report's gallery, with a
caption each, at the last epoch's step. Written where SageMaker's TensorBoardOutputConfig collects
them (/opt/ml/output/tensorboard, uploaded to its S3 path as the job runs)."""

from __future__ import annotations

from pathlib import Path

import tensorflow as tf

from keras_pipe_train.report.job_page import Gallery

MISTAKES = 8  # images in TensorBoard (the report page has more)


def pictures(writer, folder: Path, gallery: Gallery | None, evaluation: dict, step: int) -> None:
    classes = tuple(evaluation["classes"])
    with writer.as_default(step=step):
        for name in ("confusion_matrix.png", "per_class.png"):
            if (folder / name).is_file():
                image = tf.io.decode_png(tf.io.read_file(str(folder / name)), channels=3)
                tf.summary.image(f"evaluation/{name.removesuffix('.png')}", image[tf.newaxis], step=step,
                                 description=f"the exported model on {evaluation['examples']} validation examples")
        worst = gallery.mistakes[:MISTAKES] if gallery else []
        if worst:
            images = tf.stack([tf.io.decode_jpeg(m.jpeg, channels=3) for m in worst])
            captions = [f"{i + 1}. label {', '.join(m.as_json(classes)['given']) or 'none'}, predicted "
                        f"{', '.join(m.as_json(classes)['predicted']) or 'none'}, loss {m.loss:.3f}"
                        for i, m in enumerate(worst)]
            tf.summary.image("evaluation/worst_mistakes", images, step=step, max_outputs=MISTAKES,
                             description="the validation images of highest loss, worst first")
            tf.summary.text("evaluation/worst_mistakes", "\n\n".join(captions), step=step)
    writer.flush()
