"""Every command and snippet of the documentation, run as written, in the order written.

Each document runs in a checkout of its own (a copy of this one, with its virtualenvs), as a user
who follows it: one bash session for all its blocks, `.venv/bin` first on PATH (as after `source
.venv/bin/activate`), S3 and SageMaker served by moto on 127.0.0.1 (AWS_ENDPOINT_URL) with a bucket
`my-bucket`, image commands on the tests' engines. What a block needs around it is said in an HTML
comment Markdown does not show, as is a command that cannot run here, and why
(tests/docs/doc_blocks.py). A document's commands must all exit 0; some outcomes are checked after.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from tests import scheduling
from tests.conftest import REPO, SDK2_PYTHON
from tests.docs import doc_blocks
from tests.engine import BASE, ENGINE, RUN_ARGS, TAG
from tests.launcher.conftest import recorded
from tests.timeouts import wait_s

DOCUMENTS = sorted(str(p.relative_to(REPO)) for p in [REPO / "README.md", *REPO.glob("docs/*.md"),
                                                      *REPO.glob("train/**/README.md"), *REPO.glob("launch/**/README.md")]
                   if ".egg-info" not in str(p))
WHEELHOUSE = REPO / ".wheelhouse"
ENGINE_COMMAND = re.compile(r"(^|\s)(docker|podman)\s|--image\s|LAUNCH_ENGINE=")


def runnable(document: str) -> tuple[list[doc_blocks.Block], list[doc_blocks.Command]]:
    blocks = doc_blocks.blocks(REPO / document)
    shell = [c for b in blocks if b.lang in ("bash", "sh") for c in doc_blocks.commands(b)]
    return blocks, shell


def test_no_two_documents_serve_on_the_same_fixed_port():
    """The documents' tests run two at a time (make test's two workers): a server one document
    starts on a fixed port must not be one another starts, or its commands talk to the other's
    (CI once had docs/sagemaker.md's curl reach docs/local.md's MLflow server on 5000)."""
    owners: dict[str, set[str]] = {}
    for document in DOCUMENTS:
        blocks, _ = runnable(document)
        for block in blocks:
            if block.lang in ("bash", "python"):
                for port in re.findall(r"(?:--port[ =]|\s-p )(\d{4,5})\b", block.text):
                    owners.setdefault(port, set()).add(document)
    shared = {port: sorted(docs) for port, docs in owners.items() if len(docs) > 1}
    assert not shared and owners, (shared, owners)


def test_every_block_is_one_the_tests_know_how_to_run():
    """bash and python blocks run; other fences (text, tables of files) must say what they are."""
    for document in DOCUMENTS:
        for block in doc_blocks.blocks(REPO / document):
            assert block.lang in ("bash", "python", "text", ""), f"{block.where}: ```{block.lang} blocks do not run"
            if block.lang == "" and block.text.strip():
                # an unlabelled block shows files or output, never commands users would type
                first = block.text.strip().splitlines()[0]
                assert not re.match(r"(keras-pipe|python|pip|make|docker|podman)\b", first), \
                    f"{block.where}: commands belong in a ```bash block, which the tests run"
            for command in doc_blocks.commands(block) if block.lang == "bash" else []:
                reason = command.skip_reason
                assert reason is None or reason.startswith(doc_blocks.REASONS) and len(reason) > 30, \
                    f"{block.where}: a command the tests do not run must say why, beginning with one of " \
                    f"{doc_blocks.REASONS} and saying what exactly: {reason!r}"
            # what the tests know of a block is hidden from its reader (doc_blocks.py)
            assert "not tested here" not in block.text, f"{block.where}: say it in a doc-test comment: untested N REASON"
            # what a block needs around it, never a step the reader must do (doc_blocks.py)
            assert set(block.directives) <= {"python", "environment"}, f"{block.where}: {block.directives}"


def untested_commands() -> dict[str, list[str]]:
    """Each reason's commands that the tests do not run, over every document: 'README.md:19'."""
    found: dict[str, list[str]] = {}
    for document in DOCUMENTS:
        for command in runnable(document)[1]:
            if command.skip_reason:
                reason = next(r for r in doc_blocks.REASONS if command.skip_reason.startswith(r))
                found.setdefault(reason, []).append(f"{document}:{command.line}")
    return found


def test_the_readme_says_how_many_commands_are_not_tested_and_why():
    commands = sum(len(runnable(document)[1]) for document in DOCUMENTS)
    untested = untested_commands()
    sentence = " ".join((REPO / "README.md").read_text().split())
    counts = ", ".join(f"{len(untested[r])} {r.replace('needs', 'need').replace('takes', 'take')}"
                       for r in doc_blocks.REASONS if r in untested)
    expected = (f"Of the {commands} commands in the documentation, "
                f"{sum(map(len, untested.values()))} are not run by the tests: {counts}")
    assert expected in sentence, f"README.md should say: {expected!r} ({untested})"


def test_the_documents_link_to_what_exists_and_nothing_outside_the_repository():
    for document in DOCUMENTS:
        text = (REPO / document).read_text()
        # a path above the document's folder, linked or only named, must lead into the repository:
        # users clone it alone, without the folders that sit beside it here
        for path in re.findall(r"(?<![\w./])((?:\.\./)+[\w.-][\w./-]*)", text):
            target = ((REPO / document).parent / path).resolve()
            assert target.is_relative_to(REPO) and target.exists(), f"{document} names {path}, outside the repository"
        for target in re.findall(r"\]\(([^)#\s]+)(?:#[^)]*)?\)", text):
            if not re.match(r"[a-z]+://", target):
                assert ((REPO / document).parent / target).exists(), f"{document}: broken link {target}"


# (docs/job.md's table of hyperparameters: tests/job/settings/test_definitions.py, with the launcher's help)


def test_the_migration_pages_tables_are_the_dialects():
    """docs/migration.md lists every hyperparameter of both built-ins, its default and what it does
    here, as keras_pipe_train.settings.dialects reads them."""
    from keras_pipe_train.settings import dialects

    text = (REPO / "docs/migration.md").read_text()
    for heading, names in (("## The MXNet algorithm", dialects.MXNET_NAMES),
                           ("## The TensorFlow algorithm", dialects.TENSORFLOW_NAMES)):
        section = text.split(heading, 1)[1].split("\n## ", 1)[0]
        rows = re.findall(r"^\| `(\w+)` \| (.*?) \| (.*) \|$", section, re.M)
        assert rows == [(n.name, f"`{n.default}`" if n.default is not None else "none", n.here)
                        for n in names.values()], heading


def test_the_backbone_table_of_the_docs_is_the_jobs():
    from keras_pipe_train.settings.backbones import BACKBONES

    section = (REPO / "docs/job.md").read_text().split("\n## Backbones\n", 1)[1].split("\n## ", 1)[0]
    rows = re.findall(r"^\| (\w+) \| (`.*?`) \| .*? \| (\d+) \| ([\d, ]+) \|$", section, re.M)
    listed = {name: (family, int(smallest), int(size)) for family, names, smallest, sizes in rows
              for name, size in zip(re.findall(r"`(\w+)`", names), sizes.split(", "), strict=True)}
    assert listed == {b.name: (b.family, b.min_size, b.default_size) for b in BACKBONES.values()}


def test_the_keras_hub_presets_of_the_docs_are_the_jobs():
    from keras_pipe_train.settings.backbones import HUB_FAMILIES

    section = (REPO / "docs/job.md").read_text().split("\n### keras-hub's backbones\n", 1)[1].split("\n## ", 1)[0]
    table = section.split("| family | presets |", 1)[1].split("\n\n", 1)[0]
    rows = re.findall(r"^\| (.+?) \| (`.*`) \|$", table, re.M)
    assert {family: tuple(re.findall(r"`(\w+)`", names)) for family, names in rows} == HUB_FAMILIES


# --- running a document ---------------------------------------------------------------------------

def copy_checkout(folder: Path) -> Path:
    """This checkout's files (tracked, or new and not ignored), copied with their times."""
    listed = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                            capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, listed):
        if (REPO / name).is_file():
            (folder / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, folder / name)
    return folder


@pytest.fixture(scope="session")
def checkout_venv(tmp_path_factory) -> Path:
    """The .venv of the documents' checkouts: made as `make venv` makes it, offline (the pinned
    requirements come from this .venv, seen through a .pth file), the project installed editable
    from a copy of this checkout, and marked installed after everything it depends on, so that
    `make demo` there runs the demo and installs nothing. (A link to this .venv would not do: a make
    there that found it out of date reinstalled the project from the copy, into this .venv.)"""
    import sysconfig

    source = copy_checkout(tmp_path_factory.mktemp("installed-checkout"))
    venv = source / ".venv"
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, capture_output=True)
    (site,) = (venv / "lib").glob("python3*/site-packages")
    (site / "zz-requirements.pth").write_text(sysconfig.get_paths()["purelib"] + "\n")
    out = subprocess.run([str(venv / "bin/python"), "-m", "pip", "install", "--quiet", "--no-index", "--no-deps",
                          "--no-build-isolation", "-e", "train/pipemode", "-e", "train", "-e", "launch"],
                         cwd=source, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr[-3000:]
    # the commands of the pinned requirements the documents run, which `make venv` installs into .venv/bin
    # (the .pth file above shows their packages, not their commands), and uv, the Makefile's installer
    for command in ("mlflow", "aws", "uv"):
        (venv / "bin" / command).symlink_to(REPO / ".venv" / "bin" / command)
    (venv / ".installed").touch()
    return venv


@pytest.fixture
def user_machine(tmp_path, moto_endpoint, checkout_venv):
    """A checkout of this repository (its files copied with their times; its .venv, a fresh one,
    and the other virtualenvs, linked), and the environment of a user with AWS at hand (moto)."""
    import boto3

    checkout = copy_checkout(tmp_path / "checkout")
    (checkout / ".venv").symlink_to(checkout_venv)
    for venv in (".venv-sdk2", ".venv-toolkit"):
        if (REPO / venv).exists():
            (checkout / venv).symlink_to(REPO / venv)
    optout = tmp_path / "sagemaker-config.yaml"
    optout.write_text("SchemaVersion: '1.0'\nSageMaker:\n  PythonSDK:\n    Modules:\n      TelemetryOptOut: true\n")
    # (a user's shell: this one's, without AWS' settings, a virtualenv, or `make test`'s make variables, with
    # which a make the documents run would print the folders it enters and take make test's PYTEST_ARGS)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AWS_", "VIRTUAL_ENV", "PYTHONPATH"))
           and k not in ("MAKEFLAGS", "MFLAGS", "MAKELEVEL")}
    env.update(PATH=f"{checkout_venv / 'bin'}:{env['PATH']}", AWS_ENDPOINT_URL=moto_endpoint,
               AWS_ACCESS_KEY_ID="testing", AWS_SECRET_ACCESS_KEY="testing", AWS_DEFAULT_REGION="us-east-1",
               SAGEMAKER_VALIDATE_ROLE="false",  # (docs/sagemaker.md: moto lacks IAM's role simulation)
               SAGEMAKER_USER_CONFIG_OVERRIDE=str(optout), SAGEMAKER_SUPPRESS_V2_WARNING="1",
               LAUNCH_POLL_SECONDS="0.2", TF_CPP_MIN_LOG_LEVEL="2", LAUNCH_ENGINE_ARGS=RUN_ARGS,
               PIP_DISABLE_PIP_VERSION_CHECK="1")
    s3 = boto3.client("s3", endpoint_url=moto_endpoint, aws_access_key_id="testing",
                      aws_secret_access_key="testing", region_name="us-east-1")
    if "my-bucket" in [b["Name"] for b in s3.list_buckets()["Buckets"]]:  # each document starts afresh
        for page in s3.get_paginator("list_objects_v2").paginate(Bucket="my-bucket"):
            for obj in page.get("Contents", []):
                s3.delete_object(Bucket="my-bucket", Key=obj["Key"])
    else:
        s3.create_bucket(Bucket="my-bucket")
    return checkout, env


class Script:
    """The bash session that follows one document."""

    def __init__(self, checkout: Path, env: dict, moto_endpoint: str):
        self.checkout, self.env, self.moto = checkout, env, moto_endpoint
        self.work = checkout / ".doc-test"
        self.work.mkdir()
        self.lines = ["set -eo pipefail", '__at() { printf "\\n@@ %s (at %s s)\\n" "$1" "$SECONDS"; }']
        self.comparisons: list[tuple[str, Path, Path, str]] = []  # (where, dry-run output, recording, sdk)
        self.last_dry_run: Path | None = None

    def add_command(self, command: doc_blocks.Command, where: str) -> None:
        self.lines.append(f"__at {shlex.quote(where)}")
        if "--dry-run" in command.text:  # its output kept for a snippet that must send the same request
            self.last_dry_run = self.work / f"dry-run-{len(self.lines)}.json"
            self.lines.append(f"{command.text} | tee {self.last_dry_run}")
        else:
            self.lines.append(command.text)

    def add_snippet(self, block: doc_blocks.Block) -> None:
        python = block.directives.get("python", [])
        interpreter = SDK2_PYTHON if "sdk-v2" in python else REPO / ".venv" / "bin" / "python"
        script = self.work / f"snippet-{block.line}.py"
        script.write_text(block.text)
        self.lines.append(f"__at {shlex.quote(block.where)}")
        recording = self.work / f"recording-{block.line}.jsonl"
        if "same-request-as-previous-dry-run" in python:
            assert self.last_dry_run, f"{block.where}: no --dry-run command before it"
            self.lines.append(self._recorder("reset-recording") + " && " + self._recorder("start-recording"))
            self.comparisons.append((block.where, self.last_dry_run, recording, "v2" if "sdk-v2" in python else "v3"))
        environment = block.directives.get("environment", [])
        prefix, feeders = "", []
        if environment[:1] == ["pipe-channels"]:
            base, feeders = self._pipe_job(block, environment[1:])
            prefix = f"SAGEMAKER_BASE_DIR={base} "
        elif environment[:1] == ["tfrecord-file"]:
            self._tfrecord_file(self.checkout / environment[1], corrupt=False)
        self.lines += [f"{f} & __feeders+=($!)" for f in feeders]
        self.lines.append(f"{prefix}{interpreter} {script}")
        if feeders:
            self.lines.append('kill "${__feeders[@]}" 2> /dev/null || true; __feeders=()')
        if "same-request-as-previous-dry-run" in python:
            self.lines.append(f"{REPO / '.venv/bin/python'} -c {shlex.quote(_SAVE_RECORDING)} {self.moto} {recording}")
        if "save-as" in python:
            path = self.checkout / python[python.index("save-as") + 1]
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(block.text)

    def _recorder(self, call: str) -> str:
        request = f"urllib.request.urlopen(urllib.request.Request('{self.moto}/moto-api/recorder/{call}', method='POST'))"
        return f"{REPO / '.venv/bin/python'} -c \"import urllib.request; {request}\""

    def _pipe_job(self, block: doc_blocks.Block, channels: list[str]) -> tuple[Path, list[str]]:
        """A /opt/ml for a training script, and the commands of its feeders (one per channel)."""
        from keras_pipe_launch.common import container_config

        base = self.work / f"opt-ml-{block.line}"
        entries, feeders = {}, []
        for spec in channels:
            name, _, flag = spec.partition(":")
            entries[name] = container_config.channel_entry("Pipe")
            records = self.work / f"{name}-{block.line}.tfrecord"
            self._tfrecord_file(records, corrupt=flag == "corrupt")
            feeders.append(f"{REPO / '.venv/bin/python'} -m keras_pipe_launch.local.feeder --dir {base}/input/data "
                           f"--channel {name} {records} 2> /dev/null")
        (base / "input" / "data").mkdir(parents=True)
        (base / "model").mkdir()
        container_config.write(base / "input" / "config", channels=entries, hyperparameters={})
        return base, feeders

    @staticmethod
    def _tfrecord_file(path: Path, corrupt: bool) -> None:
        """The first 600 built-in digits as TFRecords of JPEG examples (the form prepare writes);
        `corrupt`: one byte of the 300th record's data flipped (its CRC no longer matches)."""
        from keras_pipe_launch.sample_data import digit_examples, load_digits
        from pipemode import tfrecord

        images, labels = load_digits()
        records = digit_examples(images[:600], labels[:600], 32)
        data = bytearray(tfrecord.encode(records))
        if corrupt:
            data[len(tfrecord.encode(records[:299])) + 12 + 20] ^= 0xFF
        path.write_bytes(bytes(data))

    def run(self, timeout: float) -> subprocess.CompletedProcess:
        """Runs the session in a process group of its own, its output in a file: a server a
        document starts in the background (`keras-pipe-serve ... &`) and leaves running when a
        later command fails would hold a pipe open, and its port, after the session ends; the
        group is killed then."""
        (self.work / "doc.sh").write_text("\n".join(self.lines) + "\n")
        log = self.work / "doc.log"
        with open(log, "wb") as output:
            session = subprocess.Popen(["bash", str(self.work / "doc.sh")], cwd=self.checkout, env=self.env,
                                       stdout=output, stderr=subprocess.STDOUT, start_new_session=True)
            try:
                session.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                pass
            finally:
                try:
                    os.killpg(session.pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
                session.wait()
        ran = log.read_text(errors="replace")
        if session.returncode == -signal.SIGKILL:
            raise AssertionError(f"the document's commands did not finish in {timeout} s:\n{ran[-6000:]}")
        return subprocess.CompletedProcess(session.args, session.returncode, ran)


_SAVE_RECORDING = """import sys, urllib.request
open(sys.argv[2], "wb").write(urllib.request.urlopen(sys.argv[1] + "/moto-api/recorder/download-recording").read())"""


def follow(document: str, checkout: Path, env: dict, moto_endpoint: str, request) -> str:
    """Runs the document's blocks in order; returns what they printed."""
    blocks, shell = runnable(document)
    if needs_the_engine(document):
        engine_env = request.getfixturevalue("docker_engine")
        env = {**env, "DOCKER_HOST": engine_env["DOCKER_HOST"]}
        # the image under the name the documents use, on podman too
        subprocess.run([*shlex.split(ENGINE), "tag", TAG, "keras-pipe-train"], check=True, capture_output=True)
    if any("sdk-v2" in b.directives.get("python", []) for b in blocks) and not SDK2_PYTHON.exists():
        pytest.skip(f"{SDK2_PYTHON} is missing: `make test` creates it")
    if any("fresh-venv" in b.directives.get("environment", []) for b in blocks):
        env = fresh_virtualenv(checkout.parent / "user-venv", env)
    script = Script(checkout, env, moto_endpoint)
    for block in blocks:
        if block.lang == "bash":
            for command in doc_blocks.commands(block):
                if command.skip_reason is None:
                    script.add_command(command, f"{Path(document).name}:{command.line}")
        elif block.lang == "python":
            script.add_snippet(block)
    try:
        out = script.run(timeout=max(60.0, wait_s(1700) - 180))  # (180 s kept for remove_containers)
    finally:
        if needs_the_engine(document):  # a container the document left running (it failed first)
            remove_containers(env)
    ran = out.stdout
    if os.environ.get("DOC_TEST_SHOW"):  # (to read what a document's commands print)
        print(ran)
    if out.returncode:
        failed = re.findall(r"^@@ (.*)$", ran, re.M)
        raise AssertionError(f"{failed[-1] if failed else document}: exit {out.returncode}\n{ran[-6000:]}")
    for where, dry_run, recording, sdk in script.comparisons:
        assert_same_request(where, json.loads(dry_run.read_text()), recording, sdk, moto_endpoint)
    return ran


def make_demo_installs_first(checkout: Path, env: dict) -> None:
    """The README's `make demo` in a fresh clone (no .venv) creates .venv, installs uv into it and,
    with uv, the pinned requirements and the project, then runs the demo: what make plans there
    (`make -n`).
    The install itself is not run again here: it is the very rule (Makefile: $(INSTALLED)) that CI's
    setup runs on its clean clone before the tests (.ci/run: `make test-setup`), online as a user's
    is; run again here, offline from the wheelhouse, it took 89 s. The checkout then gets
    its installed .venv back, and its `make demo` runs the demo alone."""
    def planned() -> list[str]:  # (in the user's shell: user_machine's `env`)
        out = subprocess.run(["make", "-n", "demo"], cwd=checkout, env=env, capture_output=True, text=True,
                             check=True)
        return [line for line in out.stdout.splitlines() if not line.lstrip().startswith("#")]

    venv = checkout / ".venv"
    installed = venv.readlink()
    venv.unlink()
    try:
        steps = planned()
    finally:
        venv.symlink_to(installed)
    assert steps == ["python3 -m venv .venv",
                     ".venv/bin/python -m pip install --quiet --disable-pip-version-check uv==0.13.9",
                     ".venv/bin/uv pip install --quiet --compile-bytecode --python .venv/bin/python "
                     "-r requirements/dev.txt",
                     ".venv/bin/uv pip install --quiet --compile-bytecode --python .venv/bin/python --no-deps "
                     "-r requirements/hub.txt -e train/pipemode -e train -e launch",
                     "touch .venv/.installed",
                     ".venv/bin/python -m keras_pipe_launch.demo"], steps
    assert planned() == [".venv/bin/python -m keras_pipe_launch.demo"]


def wheelhouse() -> Path:
    """The pinned requirements' wheels, which `make test` downloads (Makefile: WHEELHOUSE)."""
    if not (WHEELHOUSE / ".downloaded").exists():
        pytest.skip(f"{WHEELHOUSE} is missing: `make test` downloads it")
    return WHEELHOUSE


def offline_pip(env: dict) -> dict:
    """pip as a user's, but with the index off: it installs from the wheelhouse, or fails."""
    return {**env, "PIP_NO_INDEX": "1", "PIP_FIND_LINKS": str(wheelhouse())}


def remove_containers(env: dict) -> None:
    listed = subprocess.run(["docker", "ps", "-aq"], env=env, capture_output=True, text=True, timeout=wait_s(60))
    if listed.stdout.split():
        subprocess.run(["docker", "rm", "-f", *listed.stdout.split()], env=env, capture_output=True,
                       timeout=wait_s(120))


def fresh_virtualenv(folder: Path, env: dict) -> dict:
    """A user's new virtualenv, first on PATH, holding only what its pip installs (offline): a
    dependency the project forgot to declare is missing there."""
    subprocess.run([sys.executable, "-m", "venv", str(folder)], check=True, capture_output=True)
    return offline_pip({**env, "PATH": f"{folder / 'bin'}:{env['PATH']}"})


def assert_same_request(where: str, dry_run: dict, recording: Path, sdk: str, moto_endpoint: str) -> None:
    """The one CreateTrainingJob request the snippet sent is the dry run's, but for the time in the
    job's name; from SDK v2, but also for the two fields docs/sagemaker.md names."""
    requests = recorded(recording.read_text(), "CreateTrainingJob")
    assert len(requests) == 1, f"{where}: sent {len(requests)} CreateTrainingJob requests"
    (sent_request,) = requests
    if sdk == "v2":
        assert sent_request.pop("ProfilerConfig") == {"DisableProfiler": True}, where
        assert "CompressionType" not in sent_request["OutputDataConfig"], where
        sent_request["OutputDataConfig"]["CompressionType"] = "GZIP"
    # the base name, without the time each appends: keras-pipe and v3 write -YYYYmmddHHMMSS, v2 its
    # own -YYYY-mm-dd-HH-MM-SS-mmm
    for request in (sent_request, dry_run):
        base = re.fullmatch(r"([a-z0-9-]+?)-(\d{14}|\d{4}(-\d{2}){5}-\d{3})", request["TrainingJobName"])
        assert base, request["TrainingJobName"]
        request["TrainingJobName"] = base.group(1)
    assert sent_request == dry_run, f"{where}: the snippet's request differs from the dry run's"


def demo_learned(output: str, checkout: Path, new_jobs: list[dict]) -> None:
    """`make demo` (the README's first command) shows transfer learning working: 5 classes each,
    chance is 20 %; and its served model scores what the README says: the figure it gives here each
    time (the demo is seeded), within the range the pretraining's other seeds give, which another
    CPU's arithmetic may take it anywhere in."""
    summary = output[output.index("summary ("):]
    pretrain, transfer = map(int, re.findall(r"validation accuracy (\d+)%", summary))
    served = int(re.search(r"the served SavedModel scores (\d+)%", summary).group(1))
    assert pretrain >= 80 and transfer >= 85 and served >= 85, summary
    stated = re.search(r"held-out JPEGs:\s+(\d+)\s+%\s+of\s+them\s+right\s+here\s+\((\d+)-(\d+)\s+%\s+when",
                       " ".join((REPO / "README.md").read_text().split()))
    here, low, high = map(int, stated.groups())
    assert low <= here <= high and low <= served <= high, f"the README says {here} % ({low}-{high} %): {summary}"
    assert "all 180 held-out images: rows are the true digit" in output
    assert (checkout / "demo-output/transfer/algo-1/model/1/saved_model.pb").is_file()
    # its report checks the validation images' labels, asked by no hyperparameter (label_check's default)
    data = checkout / "demo-output/transfer/algo-1/output/data"
    check = json.loads((data / "label_errors.json").read_text())
    assert check["sets"]["validation"]["examined"] == 180 and "train" not in check["sets"], check
    assert "Validation images: " in (data / "report.html").read_text()
    assert "launch | fed algo-1/train pass 0:" in output  # the transfer job ran in Pipe mode


def jobs_in_pipe_mode(count: int):
    """The document created `count` training jobs, their train channel in Pipe mode."""
    def check(output: str, checkout: Path, new_jobs: list[dict]) -> None:
        assert len(new_jobs) == count, [job["TrainingJobName"] for job in new_jobs]
        for job in new_jobs:  # (a channel's own InputMode, else the job's)
            train = next(c for c in job["InputDataConfig"] if c["ChannelName"] == "train")
            mode = train.get("InputMode", job["AlgorithmSpecification"]["TrainingInputMode"])
            assert mode == "Pipe", (job["AlgorithmSpecification"], job["InputDataConfig"])

    return check


def training_jobs(moto_endpoint: str) -> dict[str, dict]:
    import boto3

    client = boto3.client("sagemaker", endpoint_url=moto_endpoint, region_name="us-east-1",
                          aws_access_key_id="testing", aws_secret_access_key="testing")
    names = [j["TrainingJobName"] for j in client.list_training_jobs(MaxResults=100)["TrainingJobSummaries"]]
    return {name: client.describe_training_job(TrainingJobName=name) for name in names}


def sdk_local_mode_made_a_model(output: str, checkout: Path, new_jobs: list[dict]) -> None:
    """docs/image.md's SDK v2 local-mode snippet ended with a complete model.tar.gz."""
    import tarfile

    with tarfile.open(checkout / "sdk-local-output" / "model.tar.gz") as archive:
        names = {member.name.removeprefix("./") for member in archive.getmembers()}
    assert {"1/saved_model.pb", "model.keras", "classes.json"} <= names, sorted(names)
    assert (checkout / "sdk-local-output" / "output.tar.gz").is_file()


def data_report_lists_the_jobs_suspects(output: str, checkout: Path, new_jobs: list[dict]) -> None:
    """docs/local.md's job, trained on prepare's output with label_error_folds, added its check to
    the dataset's report at its end (prepare/label_checks.py), which links to the job's page and
    opens in a browser with nothing asked of the network."""
    from tests.browser import open_page

    assert "suspects added to the data report prepared/report.html" in output, output[-4000:]
    report = json.loads((checkout / "prepared/data_report.json").read_text())
    (check,) = report["label_checks"]  # (the job resumed replaced its own)
    assert check["job"] == "digits-local" and check["folds"] == 5, check
    assert check["sets"]["train"]["examined"] == sum(c["train"] for c in report["classes"]), check["sets"]
    page = (checkout / "prepared/report.html").read_text()
    assert '<a href="../local-jobs/digits-local/algo-1/output/data/report.html">digits-local</a>' in page
    assert (checkout / "local-jobs/digits-local/algo-1/output/data/report.html").is_file()
    opened = open_page(checkout / "prepared/report.html", checkout / "browser-data-report")
    assert opened.console == [] and opened.requests == [], (opened.console, opened.requests)


def only_the_chief_tracked(output: str, checkout: Path, new_jobs: list[dict]) -> None:
    """docs/local.md's two hosts: the chief logged the run to MLflow (report/tracking.py), the other
    host nothing."""
    hosts = checkout / "local-jobs/digits-2-hosts"
    assert json.loads((hosts / "algo-1/output/data/tracking.json").read_text())["logged"] is True
    assert not (hosts / "algo-2/output/data/tracking.json").exists()
    said = [line for line in output.splitlines() if "MLflow tracking" in line]
    assert [line for line in said if line.startswith("algo-1 | ") and "MLflow tracking: run " in line], said
    assert not [line for line in said if not line.startswith("algo-1 | ")], said


def no_tensorflow_notices(output: str, checkout: Path, new_jobs: list[dict]) -> None:
    """keras-pipe's commands (prepare on one machine, and its instances with --local) printed their
    own lines, none of TensorFlow's start-up notices (launch/keras_pipe_launch/common/quiet_start.py)."""
    for notice in ("absl::InitializeLog", "oneDNN custom operations", "cpu_feature_guard"):
        assert notice not in output, f"{notice!r} in the document's output"


# what some documents' commands must have done, beyond exiting 0: text they printed, or a check
OUTCOMES = {
    "README.md": [demo_learned, "prepare: 1622 train and 175 validation examples of 10 classes",
                  "launch | algo-1 completed; model in", "keras-pipe submit: model: s3://", jobs_in_pipe_mode(1)],
    "docs/sagemaker.md": [jobs_in_pipe_mode(3), "keras-pipe submit: model: s3://my-bucket/jobs/",
                          "keras-pipe register: registered arn:aws:sagemaker:us-east-1:123456789012:model-package/"
                          "digits/1 (PendingManualApproval)", "keras-pipe deploy: digits-registered: InService"],
    "docs/local.md": ['"predicted_label": ', "resuming from checkpoint", "metrics: epoch=2", "algo-2 | metrics: epoch=1",
                      "launch | fed algo-1/train pass 0: 116 records", "launch | fed algo-2/train pass 0: 65 records",
                      data_report_lists_the_jobs_suspects, "backbone mobilenet_v3_small on algo-1 train_loss by epoch [(1, ",
                      only_the_chief_tracked],
    "docs/prepare.md": ["upload: 0 files uploaded, 5 already there unchanged", "prepare: 360 train and 40 "
                        "validation examples of 10 classes in 6 shards under s3://my-bucket/datasets/local-scale-digits/",
                        "s3://my-bucket/datasets/local-scale-digits/ is complete already (run ",
                        no_tensorflow_notices],
    "docs/image.md": ["launch | algo-1 completed", '"predicted_label": ', sdk_local_mode_made_a_model],
    "docs/tuning.md": ['"HyperParameterTuningJobName"'],
    "docs/sources.md": ["launch | channel train (Pipe, augmented manifest): 270 lines from s3://my-bucket/labelled/",
                        "launch | fed algo-2/train pass 0: 135 objects", "algo-2 | metrics: epoch=1",
                        '"S3DataType": "AugmentedManifestFile"', '"AttributeNames": [', "launch | algo-1 completed",
                        "class_names=('eight', 'five', 'four', 'nine', 'one', 'seven', 'six', 'three', 'two', 'zero')",
                        '"record_format": "recordio"'],
    "train/pipemode/README.md": ["bad data: corrupt record #299", "600 records", jobs_in_pipe_mode(2)],
}


def documents_to_run() -> list:
    """The documents with a command or snippet to run; those that need the image are container tests."""
    found = []
    for document in DOCUMENTS:
        blocks, shell = runnable(document)
        if any(c.skip_reason is None for c in shell) or any(b.lang == "python" for b in blocks):
            found.append(pytest.param(document, marks=pytest.mark.container) if needs_the_engine(document) else document)
    return found


def needs_the_engine(document: str) -> bool:
    """Whether the document runs image commands, or a snippet that drives a Docker Engine."""
    blocks, shell = runnable(document)
    return any(ENGINE_COMMAND.search(c.text) and c.skip_reason is None for c in shell) or any(
        "docker" in b.directives.get("python", []) for b in blocks)


def test_the_documents_that_need_the_engine_run_on_the_workers_engine():
    """`make test`'s workers share one image and one Docker Engine only if the tests that use them
    are those tests/scheduling.py keeps together."""
    for document in DOCUMENTS:
        nodeid = f"tests/docs/test_docs.py::test_the_documents_commands_run_as_written[{document}]"
        assert scheduling.needs_the_engine(nodeid) == needs_the_engine(document), document


@pytest.mark.slow
@pytest.mark.timeout(1800)
@pytest.mark.parametrize("document", documents_to_run())
def test_the_documents_commands_run_as_written(document, user_machine, moto_endpoint, request):
    checkout, env = user_machine
    if document == "README.md":
        make_demo_installs_first(checkout, env)
    if BASE and document == "docs/image.md":
        request.getfixturevalue("image")  # (skips with the reason where no engine works)
    before = training_jobs(moto_endpoint)
    output = follow(document, checkout, env, moto_endpoint, request)
    new_jobs = [job for name, job in training_jobs(moto_endpoint).items() if name not in before]
    for expected in OUTCOMES.get(document, []):
        if callable(expected):
            expected(output, checkout, new_jobs)
        else:
            assert expected in output, f"{document}: no {expected!r} in what its commands printed:\n{output[-4000:]}"
