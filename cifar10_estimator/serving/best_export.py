"""``--export-best``: keep ``<export_dir>/best/<version>``, the export of the best evaluation.

After each evaluation (locally the trainer's, in a cluster the evaluator task's), ``consider``
exports the checkpoint if its accuracy beats every earlier one and then deletes the older best
exports, so the folder, a TF Serving model base path of its own, holds one version. The best
accuracy so far is read back from the exports' ``eval_metrics.json``, so a resumed job goes on
with the same contest. Ties keep the earlier export.
"""

import logging
import os
from typing import Optional

import tensorflow as tf

from cifar10_estimator import storage
from cifar10_estimator.model.checkpoints import checkpoint_gone
from cifar10_estimator.model.model_settings import ModelSettings
from cifar10_estimator.serving.export import EVAL_METRICS_FILE, export_saved_model

log = logging.getLogger("cifar10_estimator")

BEST_SUBDIR = "best"


class BestExport:
    """Keeps ``<export_dir>/best/<version>``: the export of the best evaluation so far.

    ``consider`` exports a checkpoint whose evaluation has a higher accuracy than every earlier
    one, then deletes the older best exports, so the folder (a TF Serving model base path of
    its own) holds one version. The best accuracy so far is read back from the exports'
    ``eval_metrics.json``, so a resumed job goes on with the same contest.
    """

    def __init__(self, settings: ModelSettings, export_dir: str):
        self.settings = settings
        self.folder = storage.join(export_dir, BEST_SUBDIR)

    def _versions(self) -> list[str]:
        if not storage.isdir(self.folder):
            return []
        return [storage.join(self.folder, v) for v in storage.listdir(self.folder)
                if v.isdigit()]

    def best_accuracy(self) -> Optional[float]:
        """The highest accuracy among the best exports there are (None if there is none)."""
        best = None
        for version in self._versions():
            try:
                accuracy = float(storage.read_json(
                    storage.join(version, EVAL_METRICS_FILE))["accuracy"])
            # TypeError: an accuracy that is no number.
            except (OSError, ValueError, KeyError, TypeError):
                continue  # not one of ours
            best = accuracy if best is None else max(best, accuracy)
        return best

    def consider(self, metrics: dict, checkpoint_path: str) -> Optional[str]:
        """Exports ``checkpoint_path`` if ``metrics["accuracy"]`` beats the best so far.

        Returns the new export's path, or None (not better, or the checkpoint was deleted by
        ``--keep-checkpoint-max`` before it could be read).
        """
        accuracy = float(metrics["accuracy"])
        best = self.best_accuracy()
        if best is not None and accuracy <= best:
            return None
        older = self._versions()
        try:
            path = export_saved_model(self.settings, checkpoint_path, self.folder, metrics)
        except (tf.errors.NotFoundError, ValueError):
            if not checkpoint_gone(checkpoint_path):
                raise
            log.info("checkpoint %s was deleted before it could be exported "
                     "(--keep-checkpoint-max); keeping the best export there is",
                     os.path.basename(checkpoint_path))
            return None
        for version in older:
            storage.rmtree(version)
        log.info("best accuracy so far, %.2f%%: exported to %s", 100 * accuracy, path)
        return path
