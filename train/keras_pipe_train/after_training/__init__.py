"""The steps after training, the chief's mostly, each taking what it needs and returning its result:

    trained      what they all read (the model as trained, its settled settings, its examples), and
                 the time the other hosts wait for the chief, which each step takes its share of
    calibrate    the temperature for the served probabilities, from one pass over validation
    evaluate     the exported model's evaluation.json, from its epoch's validation sums
    conversions  the exports (TFLite, ONNX), each checked against the SavedModel on the validation images
    folder_exports  the same exports of a finished job's model folder (`keras-pipe export`)
    folder_explanations  the heatmaps of a finished job's model's predictions (`keras-pipe predict --explain`)
    label_check  the likely label errors of the validation and the training images
    report_page  the gallery of the worst mistakes (with their heatmaps), the suspects' heatmaps,
                 report.html and TensorBoard's pictures

job.py runs them in that order (job.after_training), the export between calibrate and evaluate.
The top floor of the job: it may import every part below it (report/ included).
"""
