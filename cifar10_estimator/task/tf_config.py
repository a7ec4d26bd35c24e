"""Who this task is: ``TF_CONFIG``'s value checked and parsed, once, into a ``Role``
(``config.role``).

The command reads the variable and hands its value here; nothing in this module reads the
environment. Estimator's ``RunConfig`` and TensorFlow's multi-worker strategy still read the
variable themselves (they have no other way in), so the command passes the same value.

What it owns: ``check_tf_config`` (a one-line refusal of any value ``RunConfig`` would refuse,
would crash on, or would take and fail with much later), ``parse`` (the ``Role``),
``estimator_tf_config`` (the value Estimator is given) and the lines that describe a role. The
cluster against ``--distribution-strategy`` is a check of the settings
(``config.checks.check_cluster``).

No TensorFlow here: the trainer checks its role before TensorFlow loads.
"""

import json
import re
from typing import Mapping, Optional, Sequence

from cifar10_estimator.config.role import Role
from cifar10_estimator.config.settings import TOWERS, ClusterSection, OutputSection
from cifar10_estimator.errors import UserError

# A TensorFlow job name, as device names spell it (/job:NAME/task:0).
_JOB_NAME = re.compile(r"[A-Za-z][A-Za-z0-9_]*")
_TF_CONFIG_HELP = "see docs/distributed.md"


def check_tf_config(text: Optional[str]) -> None:
    """Raises a one-line ``UserError`` naming TF_CONFIG unless ``text`` (the variable's value,
    None when unset) is a cluster and task Estimator's ``RunConfig`` takes, as they are or as
    ``parse`` maps them (a cluster of workers only).

    ``RunConfig`` reads the variable itself, but what it refuses comes as a ``TypeError``,
    ``AttributeError`` or a ``ValueError`` of several lines, and it takes addresses without a
    port, which fail only when the servers start. So the value is checked here first.
    """
    if text is None:
        return

    def refuse(what: str):
        raise UserError(f"TF_CONFIG: {what}; {_TF_CONFIG_HELP}")

    try:
        value = json.loads(text)
    except (ValueError, RecursionError) as e:
        refuse(f"not JSON ({type(e).__name__}: {' '.join(str(e).split())[:200]})")
    if not isinstance(value, dict):
        refuse(f"expected a JSON object with \"cluster\" and \"task\", got {type(value).__name__}")
    for key in ("model_dir", "session_master", "eval_session_master"):
        if key in value and not (isinstance(value[key], str) and value[key]):
            refuse(f'"{key}" must be a non-empty string')
    if value.get("service") is not None and not isinstance(value["service"], dict):
        refuse('"service" must be a JSON object')
    cluster = value.get("cluster", {})
    if not isinstance(cluster, dict):
        refuse('"cluster" must be a JSON object: job name -> list of "host:port"')
    for job, addresses in cluster.items():
        if not _JOB_NAME.fullmatch(job):
            refuse(f'the job name {job[:50]!r} in "cluster" is not a TensorFlow job name '
                   f"(letters, digits and _, starting with a letter)")
        if not isinstance(addresses, list) or not addresses:
            refuse(f'"cluster": "{job}" must be a non-empty list of "host:port"')
        for address in addresses:
            problem = _address_problem(address)
            if problem:
                refuse(f'"cluster": "{job}" lists {str(address)[:80]!r}: {problem}')
    task = value.get("task", {})
    if not isinstance(task, dict):
        refuse('"task" must be a JSON object: {"type": ..., "index": ...}')
    task_type, index = task.get("type"), task.get("index")
    if task_type is not None and not isinstance(task_type, str):
        refuse('"task": "type" must be a string')
    if isinstance(index, str) and index.isascii() and index.isdigit() and len(index) < 10:
        index = int(index)  # some orchestrators write "0"; RunConfig reads it with int()
    if index is not None and (not isinstance(index, int) or isinstance(index, bool)
                              or index < 0):
        refuse(f'"task": "index" must be a whole number, 0 or more, got {str(index)[:40]}')
    if not cluster:
        if task_type not in (None, "worker") or index not in (None, 0):
            refuse('without a "cluster" the task can only be {"type": "worker", "index": 0}')
        return
    chief = "master" if "master" in cluster else "chief"
    if chief == "master" and "chief" in cluster:
        refuse('"cluster" has both a "chief" and a "master" job; keep one')
    if chief not in cluster and "worker" in cluster:
        pass  # workers only: worker 0 acts as the chief (TensorFlow's multi-worker convention)
    elif len(cluster.get(chief, ())) != 1:
        refuse(f'"cluster" must have exactly one "{chief}" task, or only "worker" tasks '
               f'(worker 0 then acts as the chief)')
    if not task_type or index is None:
        refuse('"task" needs a "type" and an "index" with a "cluster"')
    if task_type == "evaluator":
        if chief == "master":
            refuse('a cluster with a "master" job has no "evaluator" task; use "chief"')
        return
    if task_type not in cluster:
        refuse(f'"task": "type" {task_type[:50]!r} is not a job of the cluster '
               f"({', '.join(sorted(cluster))})")
    if index >= len(cluster[task_type]):
        refuse(f'"task": "index" {index} is out of range: the cluster has '
               f'{len(cluster[task_type])} "{task_type}" task(s)')


def _address_problem(address) -> Optional[str]:
    """Why ``address`` is not ``host:port`` (``[::1]:2222`` for IPv6), or None."""
    if not isinstance(address, str):
        return "not a string"
    host, sep, port = address.rpartition(":")
    if not sep or not host:
        return "expected host:port"
    if not (port.isascii() and port.isdigit() and 1 <= int(port[-6:]) <= 65535
            and len(port) <= 5):
        return "the port must be a number from 1 to 65535"
    if any(c.isspace() or not c.isprintable() for c in host):
        return "the host has spaces or control characters"
    try:
        host.encode("utf-8")
    except UnicodeEncodeError:
        return "the host is not valid text"
    return None


def parse(text: Optional[str]) -> Role:
    """The role ``text`` (TF_CONFIG's value, None when unset) gives this task; a one-line
    ``UserError`` for a value Estimator would refuse (``check_tf_config``).

    The shapes the engines write are taken (docs/distributed.md, "Engines"): a cluster of
    workers only (TensorFlow's multi-worker convention, Ray Train's and SageMaker's) has worker
    0 as its chief and worker i as worker i - 1; one worker alone is a local run. Extra keys
    (Vertex AI's ``environment``, ``job``, ``task.trial``) are left to Estimator.
    """
    check_tf_config(text)
    value = json.loads(text) if text else {}
    cluster = {job: tuple(addresses) for job, addresses in value.get("cluster", {}).items()}
    task = value.get("task", {})
    if not cluster:
        return Role()
    task_type, index = task["type"], int(task["index"])
    if any(job in cluster for job in ("chief", "master")):
        return Role(task_type, index, cluster)
    workers = cluster.pop("worker")
    if len(workers) == 1 and set(cluster) <= {"evaluator"} and task_type == "worker":
        return Role()  # a cluster of one: nothing to wait for, share or all-reduce with
    cluster = {"chief": workers[:1], **({"worker": workers[1:]} if workers[1:] else {}),
               **cluster}
    if task_type == "worker":
        task_type, index = ("chief", 0) if index == 0 else ("worker", index - 1)
    return Role(task_type, index, cluster, workers_only=True)


def estimator_tf_config(text: Optional[str], role: Role) -> Optional[str]:
    """The TF_CONFIG value Estimator and TensorFlow's strategies must read for ``role``
    (they read the variable themselves): ``text`` itself, or for a shape ``parse`` mapped, the
    mapped cluster and task, other keys kept; None for a local run."""
    if role.local and role.task_type == "worker":
        return None
    value = json.loads(text)
    value.update(cluster={job: list(addresses) for job, addresses in role.cluster_spec.items()},
                 task={**value["task"], "type": role.task_type, "index": role.task_id})
    return json.dumps(value)


def describe(cluster: Mapping[str, Sequence[str]]) -> str:
    """One line: ``chief 127.0.0.1:2222; worker 127.0.0.1:2223, ...; ps ...``."""
    return "; ".join(f"{job} {', '.join(cluster[job])}" for job in sorted(cluster))


def role_line(role: Role, cluster: ClusterSection, output: OutputSection) -> str:
    """The log's line on this task's role (the task logs its plan once it has one)."""
    if role.task_type == "evaluator":
        return (f"role: evaluator: evaluates new checkpoints in {output.job_dir} (at most every "
                f"{output.eval_throttle_secs} s while training runs) and the final one at once")
    if role.local:
        return "role: local (no cluster in TF_CONFIG)"
    updates = ("collective all-reduce" if cluster.distribution_strategy != TOWERS else
               "synchronous" if cluster.sync else "asynchronous")
    return (f"role: {role.task_type} {role.task_id} of the cluster {describe(role.cluster_spec)}; "
            f"{role.num_trainers} training task(s), {role.num_ps} ps, {updates} updates")
