"""Kubernetes: one Job per group (each group asks for its own resources; an Indexed Job would
give every index one pod template), written as manifest files, applied by kubectl when asked.

Each Job's pod: requests = limits = the work model's CPUs and memory (the Guaranteed QoS class:
the pod's cgroup limit is the cap the planner reads inside it), a nodeSelector for the wheels'
CPU (``kubernetes.io/arch``), the store's credentials from a Secret (``envFrom``: every key of
it becomes a variable: AWS_ACCESS_KEY_ID, AWS_SECRET_ACCESS_KEY, FACTORY_S3_ENDPOINT_URL...),
and the same ``factory build`` as every engine (engines.job) with ``--uncapped``: an
unprivileged container cannot make a cgroup of its own, and needs none, its own limit is the
cap. ``restartPolicy: OnFailure`` keeps the pod and its emptyDir cache (build tree, compile
cache) across a restart of the container, so a retry resumes; ``activeDeadlineSeconds`` is
the work model's time limit.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from factory.engines.job import JobCommand, job_name
from factory.errors import EngineError
from factory.planning.work import Work, WorkGroup, memory_arg
from factory.process import find_program, run_program
from factory.toolchain.cross import CPU_PLATFORMS

APP_LABEL = "cuda-wheel-factory"
GROUP_LABEL = "cuda-wheel-factory/group"  # a key prefix is a DNS subdomain
CACHE_VOLUME = "factory-cache"


@dataclasses.dataclass(frozen=True, kw_only=True)
class KubernetesOptions:
    image: str  # has the factory, the matrix's checkout at ``workdir``, python3.X and g++
    workdir: str = "/srv/factory"
    secret: str = "factory-store"  # the Secret whose keys become the store's variables
    namespace: str | None = None
    backoff_limit: int = 2


def node_arch(machine: str) -> str:
    """The ``kubernetes.io/arch`` value of a CPU (Go's names, which are Debian's here)."""
    try:
        return CPU_PLATFORMS[machine].debian_arch
    except KeyError:
        raise EngineError(f"no Kubernetes arch known for CPU {machine!r}") from None


def job(group: WorkGroup, command: JobCommand, opts: KubernetesOptions) -> dict[str, Any]:
    """The Job manifest of one group."""
    name = job_name(group)
    quantity = {"cpu": str(group.cpus), "memory": memory_arg(group.memory_bytes) + "i"}
    labels = {"app.kubernetes.io/name": APP_LABEL, GROUP_LABEL: group.id}
    argv = command.argv(group)
    if "--uncapped" not in argv:
        argv.append("--uncapped")
    metadata: dict[str, Any] = {
        "name": name, "labels": labels,
        "annotations": {
            "cuda-wheel-factory/cells": " ".join(group.cells),
            "cuda-wheel-factory/predicted-seconds": "-".join(f"{s:.0f}" for s in group.seconds),
            "cuda-wheel-factory/predicted-peak-bytes": "-".join(str(b) for b in group.peak_bytes),
        },
    }
    if opts.namespace:
        metadata["namespace"] = opts.namespace
    return {
        "apiVersion": "batch/v1",
        "kind": "Job",
        "metadata": metadata,
        "spec": {
            "backoffLimit": opts.backoff_limit,
            "activeDeadlineSeconds": math.ceil(group.time_limit_seconds),
            "ttlSecondsAfterFinished": 7 * 24 * 3600,
            "template": {
                "metadata": {"labels": labels},
                "spec": {
                    "restartPolicy": "OnFailure",
                    "nodeSelector": {"kubernetes.io/arch": node_arch(group.machine)},
                    "containers": [{
                        "name": "build",
                        "image": opts.image,
                        "workingDir": opts.workdir,
                        "command": argv,
                        "envFrom": [{"secretRef": {"name": opts.secret}}],
                        "resources": {"requests": dict(quantity), "limits": dict(quantity)},
                        "volumeMounts": [{"name": CACHE_VOLUME,
                                          "mountPath": f"{opts.workdir.rstrip('/')}/.cache"}],
                    }],
                    "volumes": [{"name": CACHE_VOLUME, "emptyDir": {}}],
                },
            },
        },
    }


_PLAIN_KEY = re.compile(r"^[A-Za-z_][A-Za-z0-9_./-]*$")


def to_yaml(value: Any, indent: int = 0) -> str:
    """Block-style YAML of dicts, lists, strings, numbers and booleans. Every string is written
    as a JSON string (a valid double-quoted YAML scalar), so nothing in a value can change the
    document's structure."""
    pad = "  " * indent
    if isinstance(value, dict):
        if not value:
            return "{}"
        lines = []
        for k, v in value.items():
            key = k if _PLAIN_KEY.match(k) else json.dumps(k)
            if isinstance(v, (dict, list)) and v:
                lines.append(f"{pad}{key}:\n{to_yaml(v, indent + 1)}")
            else:
                lines.append(f"{pad}{key}: {to_yaml(v)}")
        return "\n".join(lines)
    if isinstance(value, list):
        if not value:
            return "[]"
        lines = []
        for item in value:
            if isinstance(item, (dict, list)) and item:
                inner = to_yaml(item, indent + 1)
                lines.append(f"{pad}- {inner.lstrip()}")
            else:
                lines.append(f"{pad}- {to_yaml(item)}")
        return "\n".join(lines)
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, (int, float)):
        return json.dumps(value)
    return json.dumps(str(value))


def write_manifests(work: Work, out: Path, command: JobCommand, opts: KubernetesOptions
                    ) -> list[Path]:
    """One ``<job name>.yaml`` per group, longest first."""
    out.mkdir(parents=True, exist_ok=True)
    paths = []
    for g in work.groups:
        p = out / f"{job_name(g)}.yaml"
        tmp = p.with_name(p.name + ".tmp")
        tmp.write_text(f"# factory work group {g.id}: {g.name}\n"
                       + to_yaml(job(g, command, opts)) + "\n")
        os.replace(tmp, p)
        paths.append(p)
    return paths


def apply(paths: Sequence[Path]) -> str:
    """``kubectl apply`` the manifests (the current context's cluster)."""
    kubectl = find_program("kubectl", tip="install kubectl and point it at the cluster")
    args: list[str | Path] = [kubectl, "apply"]
    for p in paths:
        args += ["-f", p]
    return run_program(args, what="kubectl apply", error=EngineError, timeout=300).stdout
