"""The job dir's own state: the checks before a run, the one-trainer lock and the settings record."""
