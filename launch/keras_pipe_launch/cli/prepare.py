"""`keras-pipe prepare`: images -> sharded TFRecords the training job reads, optionally uploaded.

    keras-pipe prepare ./photos ./prepared --upload s3://bucket/datasets/photos/
    keras-pipe prepare labels.csv ./prepared          # CSV rows: path,label (paths relative to it)
    keras-pipe prepare s3://bucket/photos/ ./prepared --max-side 512
    keras-pipe prepare tags.csv ./prepared --multi-label   # rows: path,label,label,... (any number)
    keras-pipe prepare s3://bucket/labels/output.manifest ./prepared   # a Ground Truth job's output

SOURCE is a folder with one subfolder per class, a CSV of path,label (paths relative to it, or
s3:// URIs), a SageMaker Ground Truth output manifest (.manifest or .jsonl: each line's source-ref,
its label, the classes' names from the label's metadata), or any of them in S3 (an s3:// prefix of
class folders, an s3:// .csv or manifest): images
are read from S3 one by one as workers need them, never copied to disk first. The images are
shuffled (seeded) and split per class into train and validation as listed, then each is checked
by decoding it; unreadable or corrupt ones are listed in OUT/rejected.txt and counted, never
silently dropped (--strict makes any of them an error). The rest become tf.train.Examples under
the feature names the job reads by default (image/encoded, image/class/label), with where each
image came from (image/source: its S3 URI, or its path under a local source), written as they
are ready into shards of about --shard-mb; memory stays bounded whatever the dataset's size.

--max-side PIXELS stores images whose longer side is larger shrunk to it, as JPEG (--jpeg-quality),
which makes every epoch's decoding much cheaper (8x for 2000x1500 photos, 23x for 12 MP ones): use it
when the photos are much larger than the model's image_size (2-3x image_size keeps room for crops);
leave it out to keep the original bytes (the job then decodes them at full size every epoch).

    OUT/train/part-00000.tfrecord ...     -> the train channel (s3://.../train/)
    OUT/validation/part-00000.tfrecord    -> the validation channel
    OUT/classes.json                      -> class names in label order: --hp class_names=...
    OUT/report.html, OUT/data_report.json -> what was found in the data (below)

Before the split, every image is read once to find duplicates: the same file twice (SHA-256), or
the same picture resized or recompressed (ImageHash's perceptual hash, within --duplicate-distance
bits). Each group stays whole in train or in validation, so no validation image is also a training
image; a group whose images carry different labels is listed as a label conflict. The data report
(report.html, a page with thumbnails; data_report.json, every group) also has the class balance
and the images' sizes. At scale (--instance-count), the plan keeps copies with the same S3 ETag in
one part; each instance fingerprints what it prepares, and the merge groups them all, moving to
train the validation images of a group the plan could not see (near copies).

The same inputs, options and seed give byte-identical shards, in any process and with any number of
workers, so re-running --upload skips every shard already in S3 with the same content (its SHA-256
is kept in the object's metadata). An OUT already used is refused; --overwrite replaces the dataset
prepared there.

At scale, an s3:// prefix of class folders into a new s3:// prefix, as a SageMaker Processing job
of the training image over N instances (or --local: N processes here), the same split and checks:

    keras-pipe prepare s3://bucket/photos/ s3://bucket/prepared/ --instance-count 8 \\
        --role arn:aws:iam::123456789012:role/SageMakerRole --image-uri ACCOUNT.dkr.ecr.REGION.amazonaws.com/IMAGE

OUT is claimed first (two runs cannot share it), the instances' reports are checked against the
plan before they are merged, and a run that fails or is stopped leaves OUT marked incomplete:
`keras-pipe prepare --finish OUT` merges it once its job has ended, or removes what it left.
Exit codes: 0 done, 1 the job or an instance failed or the reports did not add up (or --finish
removed a run), 2 an option or input to change, 130 interrupted.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

from keras_pipe_launch.cli.arguments import duration
from keras_pipe_launch.cli.job_options import use_region
from keras_pipe_launch.common.untrusted import shown
from keras_pipe_launch.prepare import duplicates, images, processing
from keras_pipe_launch.prepare.dataset import PrepareError, check_options, prepare
from keras_pipe_launch.prepare.images import bits, jpeg_quality, megabytes, whole_number
from keras_pipe_train.settings.config import (
    DEFAULT_MAX_PIXELS,  # (Pillow and TensorFlow load only when images are checked)
)


def add_parser(subparsers) -> None:
    parser = subparsers.add_parser("prepare", help="images -> sharded TFRecords, optionally uploaded to S3",
                                   description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("source", nargs="?",
                        help="a folder of class folders, a CSV of path,label, a Ground Truth output manifest, or "
                             "any of them in S3 (s3://...)")
    parser.add_argument("out", nargs="?", help="the output folder (new or empty, or see --overwrite); with "
                                               "--instance-count, a new s3:// prefix")
    parser.add_argument("--validation-fraction", type=float, default=0.1)
    parser.add_argument("--shard-mb", type=megabytes, default=100, help="target shard size")
    parser.add_argument("--seed", type=int, default=0, help="for the shuffle and the split")
    parser.add_argument("--workers", type=whole_number, default=None,
                        help="images checked in parallel (default: the CPUs; 4x that for an S3 source)")
    parser.add_argument("--max-side", type=whole_number, default=None, metavar="PIXELS",
                        help="store images whose longer side is larger shrunk to it (aspect kept), as JPEG; "
                             "default: the original bytes")
    parser.add_argument("--jpeg-quality", type=jpeg_quality, default=images.DEFAULT_QUALITY, metavar="1-100",
                        help=f"of the images --max-side shrinks (default {images.DEFAULT_QUALITY})")
    parser.add_argument("--strict", action="store_true", help="fail if any image is unusable")
    parser.add_argument("--multi-label", action="store_true",
                        help="SOURCE is a CSV of path,label,label,... rows: each image has any number of the classes "
                             "(train with --hp multi_label=true)")
    parser.add_argument("--label-attribute", default=None, metavar="NAME",
                        help="SOURCE is a SageMaker Ground Truth output manifest (an augmented manifest; .manifest or "
                             ".jsonl: this is found from its metadata) and NAME its label attribute")
    parser.add_argument("--max-image-pixels", type=whole_number, default=DEFAULT_MAX_PIXELS, metavar="PIXELS",
                        help="larger images (width x height, from their header) are rejected before decoding, as "
                             f"the job does (its max_image_pixels; default {DEFAULT_MAX_PIXELS})")
    parser.add_argument("--duplicate-distance", type=bits, default=None, metavar="BITS",
                        help="images whose perceptual hashes (64 bits) differ in at most BITS are near-duplicates "
                             f"(default {duplicates.DISTANCE}; 0: the same picture only)")
    parser.add_argument("--no-duplicate-check", action="store_true",
                        help="do not look for duplicates (each image is then read once, not twice)")
    parser.add_argument("--upload", metavar="S3_PREFIX", default=None, help="then upload OUT to s3://bucket/prefix/")
    parser.add_argument("--overwrite", action="store_true",
                        help="replace the dataset an earlier run prepared in OUT (nothing else is ever deleted)")
    add_at_scale_arguments(parser)
    parser.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from boto3.exceptions import S3UploadFailedError
    from botocore.exceptions import BotoCoreError, ClientError

    from keras_pipe_launch.common.engine import EngineError
    from keras_pipe_launch.common.objects import SourceError
    from keras_pipe_launch.prepare.run_state import RunStateError
    from keras_pipe_launch.sagemaker.request import RequestError

    try:
        os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
        if args.finish:
            if args.source or args.out:
                raise PrepareError("--finish OUT takes no SOURCE or other OUT")
            use_region(args)
            return processing.finish_later(args.finish)
        if not (args.source and args.out):
            raise PrepareError("give SOURCE and OUT (or --finish OUT)")
        return run_at_scale(args) if args.instance_count is not None else run_here(args)
    except processing.Interrupted as err:
        print(f"keras-pipe prepare: {shown(str(err))}", file=sys.stderr)
        return processing.INTERRUPTED
    except KeyboardInterrupt:
        print("\nkeras-pipe prepare: interrupted", file=sys.stderr)
        return processing.INTERRUPTED
    except processing.RunFailed as err:
        print(f"keras-pipe prepare: error: {shown(str(err))}", file=sys.stderr)
        return 1
    except (PrepareError, SourceError, RequestError, EngineError, RunStateError) as err:
        print(f"keras-pipe prepare: error: {shown(str(err))}", file=sys.stderr)
        return 2
    # (boto3's upload_file says a failed upload as S3UploadFailedError, which is neither of botocore's)
    except (BotoCoreError, ClientError, S3UploadFailedError) as err:
        print(f"keras-pipe prepare: {'upload' if args.upload else 'a call to AWS'} failed: {shown(str(err))}",
              file=sys.stderr)
        return 1


def duplicate_distance(args: argparse.Namespace) -> int | None:
    """The duplicates' distance the options ask for; None: not looked for."""
    if args.no_duplicate_check and args.duplicate_distance is not None:
        raise PrepareError("--duplicate-distance and --no-duplicate-check: give one")
    if args.no_duplicate_check:
        return None
    return duplicates.DISTANCE if args.duplicate_distance is None else args.duplicate_distance


def run_here(args: argparse.Namespace) -> int:
    """`keras-pipe prepare SOURCE OUT` on this machine, then --upload."""
    for option in ("dry_run", "local", "role", "image_uri", "job_dir", "image"):
        if getattr(args, option):
            raise PrepareError(f"--{option.replace('_', '-')} is for a prepare at scale: give --instance-count")
    distance = duplicate_distance(args)
    if args.upload:
        from keras_pipe_launch.common.objects import parse_s3_uri

        parse_s3_uri(args.upload)  # before the work, not after
    prepare(args.source, Path(args.out), validation_fraction=args.validation_fraction, shard_mb=args.shard_mb,
            seed=args.seed, workers=args.workers, strict=args.strict, max_pixels=args.max_image_pixels,
            max_side=args.max_side, quality=args.jpeg_quality, overwrite=args.overwrite,
            multi_label=args.multi_label, label_attribute=args.label_attribute, duplicate_distance=distance)
    if args.upload:
        from keras_pipe_launch.prepare.upload import upload

        upload(Path(args.out), args.upload)
    return 0


# --- at scale: a SageMaker Processing job (prepare.processing) -------------------------------------

def add_at_scale_arguments(parser) -> None:
    group = parser.add_argument_group(
        "at scale: a SageMaker Processing job (SOURCE an s3:// prefix of class folders, OUT a new s3:// prefix)")
    group.add_argument("--instance-count", type=whole_number, default=None, metavar="N",
                       help="prepare on N instances, each its ShardedByS3Key share of the source objects")
    group.add_argument("--instance-type", default="ml.c5.4xlarge")
    group.add_argument("--role", help="the job's IAM role ARN (reads SOURCE, writes OUT)")
    group.add_argument("--image-uri", help="this project's image (it holds the prepare code)")
    group.add_argument("--volume-size", type=int, default=100, metavar="GB",
                       help="per instance: holds its share of the source (default 100)")
    group.add_argument("--max-run", type=duration, default=24 * 3600, metavar="DURATION", help="e.g. 6h, 2d")
    group.add_argument("--job-name", default=None, help="default: keras-pipe-prepare-YYYYmmddHHMMSS")
    group.add_argument("--region", default=None)
    group.add_argument("--dry-run", action="store_true",
                       help="print the CreateProcessingJob request; list, write and create nothing")
    group.add_argument("--local", action="store_true",
                       help="run the N instances here as processes (their /opt/ml under --job-dir), not on SageMaker")
    group.add_argument("--job-dir", type=Path, default=None,
                       help="with --local: where the instances' /opt/ml go (default ./local-jobs/<job name>)")
    group.add_argument("--image", default=None,
                       help="with --local: run each instance in this image (the engine: $LAUNCH_ENGINE or docker)")
    group.add_argument("--finish", metavar="OUT", default=None,
                       help="merge a run into OUT whose job ended after this command stopped following it, or remove "
                            "what a failed or interrupted run left there (it says which)")


def run_at_scale(args) -> int:
    """`keras-pipe prepare ... --instance-count N`; raises PrepareError (and the launcher's
    RequestError, SourceError) for what the user must change."""
    import time

    from keras_pipe_launch.sagemaker.request import RequestError
    from keras_pipe_train.settings.contract import JOB_NAME

    check_at_scale(args)
    distance = duplicate_distance(args)  # (checked too before anything is listed, written or sent)
    arguments = processing.instance_arguments(args.shard_mb, args.max_side, args.jpeg_quality,
                                              args.max_image_pixels, args.workers)
    name = args.job_name or time.strftime("keras-pipe-prepare-%Y%m%d%H%M%S")
    if not JOB_NAME.match(name):  # (it also names the local instances' folders and containers)
        raise RequestError(f"--job-name {name!r}: 1-63 letters, digits and hyphens")
    if args.local:
        processing.prepare_locally(args.source, args.out, instance_count=args.instance_count,
                                   job_dir=args.job_dir or Path("local-jobs") / name,
                                   validation_fraction=args.validation_fraction, seed=args.seed, strict=args.strict,
                                   arguments=arguments, image=args.image, duplicate_distance=distance)
        return 0
    request = processing_request(args, name, arguments)
    if args.dry_run:
        print(json.dumps(request, indent=2))
        return 0
    use_region(args)
    return processing.run_on_sagemaker(request, args.source, args.out, validation_fraction=args.validation_fraction,
                                       seed=args.seed, strict=args.strict, duplicate_distance=distance)


def check_at_scale(args) -> None:
    from keras_pipe_launch.sagemaker.request import RequestError

    if args.overwrite:
        raise PrepareError("--overwrite is for a prepare on one machine: at scale, OUT must be a new prefix")
    if args.multi_label or args.label_attribute:
        raise PrepareError(f"--{'multi-label' if args.multi_label else 'label-attribute'} reads a CSV or a manifest, "
                           "which is prepared on one machine: at scale, SOURCE is a prefix of class folders")
    if not (args.source.startswith("s3://") and args.out.startswith("s3://")):
        raise PrepareError("--instance-count prepares an s3:// SOURCE into an s3:// OUT (the instances share "
                           "the objects under SOURCE); on one machine, leave --instance-count out")
    if args.upload:
        raise PrepareError("--upload is for a one-machine prepare: with --instance-count, OUT is already in S3")
    if args.dry_run and args.local:
        raise PrepareError("--dry-run prints a SageMaker Processing job's request; --local runs the instances here "
                           "and sends none: give one of them")
    check_options(args.validation_fraction, args.max_side)
    # (what start_run checks before it claims OUT, checked here too: --dry-run refuses what the run would)
    processing.check_apart(processing.source_prefix(args.source), args.out)
    if args.instance_count > processing.PROCESSING_LIMITS["instance_count"]:
        raise RequestError(f"--instance-count must be 1 to {processing.PROCESSING_LIMITS['instance_count']} (a "
                           "Processing job's limit)")


def processing_request(args, name: str, arguments: list[str]) -> dict:
    """The CreateProcessingJob request, once its image, role and resources are checked."""
    from keras_pipe_launch.sagemaker import api_limits
    from keras_pipe_launch.sagemaker.request import RequestError, check_image_and_role

    if not (args.role and args.image_uri):
        raise RequestError("a Processing job needs --role and --image-uri (or --local to run it here)")
    check_image_and_role(args.image_uri, args.role)
    processing.check_processing_resources(args.instance_type, args.instance_count, args.volume_size, args.max_run)
    source = processing.source_prefix(args.source)
    request = processing.processing_job_request(name, source, args.out, image_uri=args.image_uri, role=args.role,
                                             instance_count=args.instance_count, instance_type=args.instance_type,
                                             volume_size_gb=args.volume_size, max_run_s=args.max_run,
                                             arguments=arguments)
    api_limits.check(request, "CreateProcessingJob")
    return request
