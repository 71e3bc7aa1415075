"""Ray's worker setup (``ray/_private/workers/setup_worker.py``) without importing Ray.

A local Ray's raylet starts every worker through a setup script run by Python. Ray's own
imports Ray (about half a CPU-second) only to read the runtime environment's context and exec the
worker (``RuntimeEnvContext.exec_worker``): once for every Python worker and every Java
worker (RayDP's app master, Spark's executors, each on the way to Spark's first event). This
does the same with the standard library only (Ray 2.60's logic on Linux, ~0.03 s), and
gives Java workers `JAVA_ENVIRONMENT`; `txstream.cluster.ray_runtime` gives it to the local
Rays it starts.
"""

import sys

if __name__ == "__main__":
    del sys.path[0]  # run by path: its folder (this package) must not shadow the library

import json  # noqa: E402
import os  # noqa: E402
import re  # noqa: E402
import shlex  # noqa: E402
from importlib.util import find_spec  # noqa: E402

_OPTIONS = ("--serialized-runtime-env-context", "--language")

JAVA_ENVIRONMENT = {"GRPC_EXPERIMENTS": "work_stealing"}
"""gRPC's work-stealing thread pool in Java workers (unless the environment names gRPC's
experiments itself). A Java worker's first call, to its raylet for the system config, is
made on a channel of its own, the process's only one then; destroying it shuts gRPC's
event engine down, and its original thread pool then waits for a thread it started while
busy, which first sleeps a whole second: now and then a Java worker would start a second
late (RayDP's app master, or Spark's executor, on the way to Spark's first event); this
pool has no such wait."""


def split(argv: list[str]) -> tuple[dict[str, str | None], list[str]]:
    """This script's two options (``--name=value`` or ``--name value``) and the other
    arguments in order, as Ray's ``argparse.parse_known_args`` gives them."""
    options: dict[str, str | None] = {}
    rest: list[str] = []
    args = iter(argv)
    for arg in args:
        name, equals, value = arg.partition("=")
        if name in _OPTIONS:
            options[name] = value if equals else next(args, None)
        else:
            rest.append(arg)
    return options, rest


def command(argv: list[str]) -> str:
    """The shell command that runs the worker (the environment updated first)."""
    options, rest = split(argv)
    context = json.loads(options.get("--serialized-runtime-env-context") or "{}")
    for key, value in (context.get("env_vars") or {}).items():  # ray's update_envs
        os.environ[key] = re.sub(r"\$\{[A-Z0-9_]+\}", "", os.path.expandvars(value))
    language = options.get("--language")
    if language == "JAVA":
        for key, value in JAVA_ENVIRONMENT.items():
            os.environ.setdefault(key, value)
        ray = list(find_spec("ray").submodule_search_locations)[0]
        jars = [path for jar in context.get("java_jars") or [] for path in (f"{jar}/*", jar)]
        executable = ["java"]
        rest = ["-cp", os.path.join(ray, "jars", "*") + ":" + ":".join(jars), *rest]
    elif language == "PYTHON":
        executable = ["exec", context.get("py_executable") or sys.executable]
    else:
        executable = ["exec"]
    if context.get("override_worker_entrypoint"):
        rest[0] = context["override_worker_entrypoint"]
    prefix = context.get("command_prefix") or []
    return " ".join([*prefix, *executable, *(shlex.quote(arg) for arg in rest)])


if __name__ == "__main__":
    os.execvp("bash", ["bash", "-c", command(sys.argv[1:])])
