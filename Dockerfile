# The image k8s/tfjob.yaml runs: the package and its dependencies on Python 3.11 (TensorFlow
# 2.15, the last release with tf.estimator, supports Python up to 3.11; the package needs
# 3.11.4 or newer, which every python:3.11 image has).
#
#   docker build -t REGISTRY/cifar10-estimator:0.1.0 .
#   docker push REGISTRY/cifar10-estimator:0.1.0
#
# Every replica runs `python -m cifar10_estimator` (its role comes from TF_CONFIG); the
# generator is the console script cifar10-generate-tfrecords.
FROM python:3.11-slim

WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY cifar10_estimator ./cifar10_estimator
# The s3 extra: tensorflow-io for s3:// job dirs and records (k8s/tfjob-s3.yaml).
RUN pip install --no-cache-dir '.[s3]' && rm -rf /src

# Root, as the manifest's volume expects; with a securityContext of your own, the user needs
# write access to the volume and a home (the precision probes cache there, in ~/.cache).
WORKDIR /root
CMD ["python", "-m", "cifar10_estimator", "--help"]
