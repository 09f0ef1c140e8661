"""The client code of AWS's sample notebooks for SageMaker's built-in image classifiers (aws/
amazon-sagemaker-examples at 4883224d: introduction_to_amazon_algorithms/imageclassification_caltech,
_mscoco_multi_label, image_classification_tensorflow, and the Ground Truth demo), each cell copied
line for line into a function of its own, its globals (the clients, the notebook's names, its
imports of SageMaker's classes) as arguments. Only json and numpy here, as in the notebooks: the
cells run in the tests' environment against stand-ins of the AWS clients
(tests/serve/test_builtin_clients.py) and under SDK v2 against its real local-mode Predictor
(tests/image/sdk_local_run.py)."""

import json

import numpy as np


def a1_cell_45(runtime, endpoint_name, file_name, object_categories):
    """Image-classification-fulltraining.ipynb, cell 45 (A2's cell 49, A3, A4: the same lines)."""
    import json

    import numpy as np

    with open(file_name, "rb") as f:
        payload = f.read()
        payload = bytearray(payload)
    response = runtime.invoke_endpoint(
        EndpointName=endpoint_name, ContentType="application/x-image", Body=payload
    )
    result = response["Body"].read()
    # result will be in json format and convert it to ndarray
    result = json.loads(result)
    # the result will output the probabilities for all classes
    # find the class with maximum probability and print the class index
    index = np.argmax(result)
    print("Result: label - " + object_categories[index] + ", probability - " + str(result[index]))
    return object_categories[index], result


def a8_cell_35(ic_classifier, file_name, object_categories, IdentitySerializer):
    """Image-classification-incremental-training-highlevel.ipynb, cell 35 (its import of
    IdentitySerializer, from sagemaker.serializers: the caller's)."""
    with open(file_name, "rb") as f:
        payload = f.read()

    ic_classifier.serializer = IdentitySerializer("image/jpeg")
    result = json.loads(ic_classifier.predict(payload))
    # the result will output the probabilities for all classes
    # find the class with maximum probability and print the class index
    index = np.argmax(result)
    print("Result: label - " + object_categories[index] + ", probability - " + str(result[index]))
    return object_categories[index]


def a10_cell_61(client, endpoint_name, CLASS_LIST, test_images):
    """The Ground Truth demo's cell 61 (its folder test_inputs/ is the photos' here)."""
    with open("test_inputs/{}".format(test_images[0]), "rb") as f:  # noqa: UP032 (as the notebook has it)
        payload = f.read()
        payload = bytearray(payload)

    response = client.invoke_endpoint(
        EndpointName=endpoint_name, ContentType="application/x-image", Body=payload
    )

    # `response` comes in a json format, let's unpack it.
    result = json.loads(response["Body"].read())
    # The result outputs the probabilities for all classes.
    # Find the class with maximum probability and print the class name.
    print("Model prediction is: {}".format(CLASS_LIST[np.argmax(result)]))  # noqa: UP032
    return CLASS_LIST[np.argmax(result)]


def a1_cell_31_get_label(s3_client, bucket, prefix, object_categories):
    """Image-classification-fulltraining.ipynb, cell 31's get_label (A2's cell 36: the same)."""
    filename = prefix.split("/")[-1]
    s3_client.download_file(bucket, prefix, filename)
    with open(filename) as f:
        data = json.load(f)
        index = np.argmax(data["prediction"])
        probability = data["prediction"][index]
    print("Result: label - " + object_categories[index] + ", probability - " + str(probability))
    return object_categories[index], probability


def a9_cell_35(ic_classifier, file_name, classes):
    """Image-classification-multilabel-lst.ipynb, cell 35 (its file_name and classes: arguments)."""
    with open(file_name, "rb") as image:
        f = image.read()
        b = bytearray(f)

    results = ic_classifier.predict(b)
    prob = json.loads(results)
    for idx, val in enumerate(classes):  # noqa: B007 (as the notebook has it)
        print("%s:%f " % (classes[idx], prob[idx]), end="")  # noqa: UP031
    return prob


def b1_cell_18(base_model_predictor, images, HTML, display):
    """Amazon_TensorFlow_Image_Classification.ipynb, cell 18: the top-5 labels (IPython's HTML
    and display, and the cell's import of them, are the caller's)."""

    def predict_top_k_labels(probabilities, labels, k):
        topk_prediction_ids = sorted(
            range(len(probabilities)), key=lambda index: probabilities[index], reverse=True
        )[:k]
        topk_class_labels = ", ".join([labels[id] for id in topk_prediction_ids])
        return topk_class_labels

    for image_filename in images.keys():
        with open(image_filename, "rb") as file:
            img = file.read()
        query_response = base_model_predictor.predict(
            img, {"ContentType": "application/x-image", "Accept": "application/json;verbose"}
        )
        model_predictions = json.loads(query_response)
        labels, probabilities = model_predictions["labels"], model_predictions["probabilities"]
        top5_class_labels = predict_top_k_labels(probabilities, labels, 5)
        display(
            HTML(
                f'<img src={image_filename} alt={image_filename} align="left" style="width: 250px;"/>'
                f"<figcaption>Top-5 predictions: {top5_class_labels} </figcaption>"
            )
        )


def b1_cell_44(finetuned_predictor, flower_images, HTML, display):
    """The same notebook's cell 44: the fine-tuned model's predicted label."""
    for image_filename in flower_images.keys():
        with open(image_filename, "rb") as file:
            img = file.read()
        query_response = finetuned_predictor.predict(
            img, {"ContentType": "application/x-image", "Accept": "application/json;verbose"}
        )
        model_predictions = json.loads(query_response)
        predicted_label = model_predictions["predicted_label"]
        display(
            HTML(
                f'<img src={image_filename} alt={image_filename} align="left" style="width: 250px;"/>'
                f"<figcaption>Predicted Label: {predicted_label}</figcaption>"
            )
        )
