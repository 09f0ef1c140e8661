"""The documentation's tests need the image's fixtures for docs/image.md's commands."""

from tests.image.conftest import docker_engine, image  # noqa: F401 (fixtures, found by name)
