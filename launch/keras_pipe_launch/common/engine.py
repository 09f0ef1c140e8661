"""How the launcher runs a job's hosts (a local training job's, a local prepare's instances): as
local processes, with the environment a job would get on SageMaker (none of this shell's AWS
credentials), or in containers of an engine named by the user (docker, podman)."""

from __future__ import annotations

import dataclasses
import os
import shlex
import shutil


class EngineError(ValueError):
    """The container engine cannot be run: the message says which command and how to name another."""


# On SageMaker a job gets its execution role's credentials, never its launcher's, and in a
# container here it gets none: a local process would inherit this shell's. These are taken out,
# and the AWS config files pointed away, so that the job sees no credentials either way (give it
# some explicitly with --env; their values are redacted in what is printed).
AWS_CREDENTIAL_VARIABLES = (
    "AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_SECURITY_TOKEN",
    "AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_ROLE_ARN", "AWS_ROLE_SESSION_NAME",
    "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
    "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_CONTAINER_AUTHORIZATION_TOKEN",
    "AWS_CONTAINER_AUTHORIZATION_TOKEN_FILE",
)
NO_AWS_CREDENTIALS = {"AWS_SHARED_CREDENTIALS_FILE": os.devnull, "AWS_CONFIG_FILE": os.devnull,
                      "AWS_EC2_METADATA_DISABLED": "true"}


def host_environment() -> dict[str, str]:
    """What a local-process job inherits from this shell: everything but AWS credentials."""
    inherited = {k: v for k, v in os.environ.items() if k not in AWS_CREDENTIAL_VARIABLES}
    return {**inherited, **NO_AWS_CREDENTIALS}


@dataclasses.dataclass(frozen=True)
class Engine:
    """The container engine command and its extra `run` arguments, from LAUNCH_ENGINE (e.g.
    "docker", or "podman --runtime runc": global options go here) and LAUNCH_ENGINE_ARGS
    (e.g. "--ulimit nofile=1024:1024 --network none", placed after `run`)."""

    command: tuple[str, ...] = ("docker",)
    run_args: tuple[str, ...] = ()

    @classmethod
    def from_environment(cls, command: str | None = None) -> Engine:
        return cls(tuple(shlex.split(command or os.environ.get("LAUNCH_ENGINE") or "docker")),
                   tuple(shlex.split(os.environ.get("LAUNCH_ENGINE_ARGS", ""))))

    def require(self) -> Engine:
        """This engine, once its command is found (before any folder is made for the job)."""
        if not self.command or shutil.which(self.command[0]) is None:
            shown = shlex.join(self.command) or "''"
            raise EngineError(f"no container engine {shown!r} on this machine's PATH: install it, or name another "
                              "with LAUNCH_ENGINE (e.g. LAUNCH_ENGINE=podman)")
        return self
