"""What a person reads after the job, written at its end from the exported model and the epochs:

    evaluation            the validation channel's metrics, each class's scores, the confusion matrix
    mistakes              the validation images the model gets most wrong
    job_page              output/data/report.html, from the two above and the learning curves
    pages                 self-contained HTML pages (the job's, and prepare's data report in the launcher)
    tensorboard_pictures  the confusion matrix and the worst mistakes, in TensorBoard
    text                  text nobody sanitised (class names, keys), as it can be printed or drawn
    suspects              the label check's files (CSV, Ground Truth manifest, JSON) and page section
    epoch_log             each epoch's metric lines, TensorBoard's scalars, metrics.json's rows
    tracking              the run in MLflow, when MLFLOW_TRACKING_URI is set (the chief's, never failing the job)
    keras_pipe_pyfunc     MLflow's loader of the exported model (copied into the logged model, imports none of ours)

The top floor below the job: it may import settings/, sources/, model/ and training/.
"""
