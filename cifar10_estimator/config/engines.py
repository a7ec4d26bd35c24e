"""What the managed engines tell a training program through its environment, as settings.

SageMaker and Vertex AI name the folders a job must use in environment variables rather than
flags. The trainer takes them as defaults under the flags given (a flag wins): ``settings``
returns them from an environment the command passes in. The TF_CONFIG shapes the engines write
are ``distributed.tf_config``'s; docs/distributed.md, "Engines", has the table of both.

No TensorFlow here: the trainer resolves its settings before it loads.
"""

from typing import Mapping

# (variable, setting, engine, what the engine means by it). Sources: SageMaker's training
# toolkit environment (sagemaker-training-toolkit, "Environment variables": SM_MODEL_DIR, the
# folder uploaded as the model artifact; SM_CHANNEL_<NAME>, a channel's local copy) and Vertex
# AI's custom training (cloud.google.com/vertex-ai/docs/training/code-requirements:
# AIP_MODEL_DIR, AIP_CHECKPOINT_DIR under the job's baseOutputDirectory).
VARIABLES = (
    ("SM_MODEL_DIR", "export_dir", "SageMaker", "the folder it uploads as the model artifact"),
    ("SM_CHANNEL_TRAINING", "data_dir", "SageMaker", "the 'training' channel's local copy"),
    ("AIP_MODEL_DIR", "export_dir", "Vertex AI", "where the model's artifacts go"),
    ("AIP_CHECKPOINT_DIR", "job_dir", "Vertex AI", "where checkpoints go"),
)


def settings(environ: Mapping[str, str]) -> dict[str, tuple[str, str]]:
    """Setting -> (value, the variable that gave it), for the engines' variables set (not
    empty) in ``environ``; a later row of ``VARIABLES`` never overrides an earlier one."""
    found: dict[str, tuple[str, str]] = {}
    for variable, name, _, _ in VARIABLES:
        if environ.get(variable) and name not in found:
            found[name] = (environ[variable], variable)
    return found
