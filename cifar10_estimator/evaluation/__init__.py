"""Evaluating a trained model outside training (an export or a checkpoint, once) and the
evaluation report both that and the trainer write."""
