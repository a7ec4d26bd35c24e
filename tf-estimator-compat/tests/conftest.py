"""The layer in the tests' own process, before anything imports the estimator: as a program
that uses it installs it."""

import tf_estimator_compat

tf_estimator_compat.install()
