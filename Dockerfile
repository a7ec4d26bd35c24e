# The image k8s/tfjob.yaml runs: the package and its dependencies, the default pair of
# docs/versions.md (Python 3.11 with the newest TensorFlow tested, which CI's first leg runs).
#
#   docker build -t REGISTRY/cifar10-estimator:0.1.0 .
#   docker push REGISTRY/cifar10-estimator:0.1.0
#
# For s3:// job dirs and records (k8s/tfjob-s3.yaml), the s3 extra: tensorflow-io, with the
# TensorFlow it works with (2.15, on this Python 3.11; CI's second leg):
#
#   docker build --build-arg EXTRAS='[s3]' -t REGISTRY/cifar10-estimator:0.1.0-s3 .
#
# Every replica runs `python -m cifar10_estimator` (its role comes from TF_CONFIG); the
# generator is the console script cifar10-generate-tfrecords.
FROM python:3.11-slim

ARG EXTRAS=""
WORKDIR /src
COPY pyproject.toml README.md LICENSE ./
COPY cifar10_estimator ./cifar10_estimator
COPY tf-estimator-compat ./tf-estimator-compat
RUN pip install --no-cache-dir ./tf-estimator-compat ".${EXTRAS}" && rm -rf /src

# Root, as the manifest's volume expects; with a securityContext of your own, the user needs
# write access to the volume and a home (the precision probes cache there, in ~/.cache).
WORKDIR /root
CMD ["python", "-m", "cifar10_estimator", "--help"]
