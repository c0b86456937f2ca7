# The serving image, in two flavours that share every layer of the product itself: NGINX, the
# router's venv, `serve`, the non-root user and the SageMaker labels. `FLAVOR` picks the base:
#
# - gpu (the default): NVIDIA Triton from NGC (TensorRT, ONNX Runtime and python backends), for the
#   GPU instances this product exists for. NGC 25.02: Ubuntu 24.04, Python 3.12 (the router needs
#   3.11 or later), TensorRT 10, CUDA compute capability 7.5 and later (T4 on g4dn, A10G on g5, L4 on
#   g6). The router's gRPC client speaks Triton's stable API, so a newer server than the local 2.51
#   is fine. Build the model repository for the target first (README, "Deploying to SageMaker"): the
#   models/ copied in are the fallback when no ModelDataUrl is given.
# - cpu: a slim Debian with Triton from the nvidia-pytriton wheel (python backend: the `python`
#   target's models, ONNX Runtime inside Triton), for CPU instances, where SageMaker also gives
#   custom containers multi-model endpoints. No models inside: the repository comes from
#   /opt/ml/model (ModelDataUrl) or /opt/ml/models (multi-model endpoints).
#
#   docker build --build-arg FLAVOR=cpu -t multi-model:cpu .     (make image does this)
#
# CPU_BASE is any Debian 12 image: the public one by default; `make image` passes a local one
# where no registry can be reached.
ARG FLAVOR=gpu
ARG GPU_BASE=nvcr.io/nvidia/tritonserver:25.02-py3
ARG CPU_BASE=docker.io/library/debian:bookworm-slim

FROM ${GPU_BASE} AS base-gpu
# NGINX in front of the router; python3-venv for the router's own environment (Ubuntu 24.04's
# system Python is externally managed). DL3008 (pin apt versions): the base image pins the
# distribution, and a pinned patch version disappears from the archive at its next security
# update, which would break every rebuild.
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends nginx python3-venv \
    && rm -rf /var/lib/apt/lists/*
# The base image's non-root user, triton-server, is uid and gid 1000.
COPY models/ /opt/program/models/

FROM ${CPU_BASE} AS base-cpu
# Python 3.11 with its shared library (Triton's python backend stub links it) and NGINX; a non-root
# user with the uid and gid the GPU image's user has. DL3008 (pin apt versions): as above.
# hadolint ignore=DL3008
RUN apt-get update \
    && DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends \
        python3 python3-venv libpython3.11 nginx \
    && rm -rf /var/lib/apt/lists/* \
    && groupadd --gid 1000 model-server \
    && useradd --uid 1000 --gid 1000 --no-create-home --home-dir /nonexistent --shell /usr/sbin/nologin model-server
# Triton itself, from the nvidia-pytriton wheel (requirements-triton.txt), goes into the venv below.
ENV REQUIREMENTS_TRITON=requirements-triton.txt

# The product on the chosen base. DL3006 (tag the image): a stage of this file, not an image.
# hadolint ignore=DL3006
FROM base-${FLAVOR}

# SageMaker's port variable is honoured; the container API for multi-model endpoints is served
# (SAGEMAKER_MULTI_MODEL=true: POST/GET/DELETE /models, POST /models/<name>/invoke).
LABEL com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true \
      com.amazonaws.sagemaker.capabilities.multi-models=true

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/opt/program:$PATH

WORKDIR /opt/program

# Requirements first: a code change does not reinstall them. PIP_CERT: a CA bundle for pip, for
# builds whose downloads pass a TLS proxy (make image mounts the host's bundle and names it).
ARG PIP_CERT
# GENERATION=true: torch and transformers too (requirements-generation.txt), for text2text models,
# whose generate() runs inside Triton's python backend; a large layer, so off by default.
ARG GENERATION=false
COPY requirements.txt requirements-triton.txt requirements-generation.txt ./
RUN /usr/bin/python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check -r requirements.txt \
        ${REQUIREMENTS_TRITON:+-r "$REQUIREMENTS_TRITON"} \
    && if [ "$GENERATION" = "true" ]; then \
        /opt/venv/bin/pip install --no-cache-dir --disable-pip-version-check -r requirements-generation.txt; fi

# The image pipelines' python-backend steps (model.py in <model>_preprocess, ...) run the router's
# own clients: Triton's python stub takes the first python3 on PATH, the venv's, and this .pth
# puts /opt/program (app/, clients/) on that interpreter's path.
RUN echo /opt/program > "$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/opt-program.pth"

# The code last: a change to it rebuilds only these layers.
COPY serve nginx.conf ./
COPY app/ app/
COPY clients/ clients/

# Non-root (uid and gid 1000; numeric, so the host need not resolve the name). NGINX listens on
# 8080 (SAGEMAKER_BIND_TO_PORT), above 1024, and `serve` keeps its runtime files in a fresh
# directory under /tmp; /opt/ml/model (the ModelDataUrl, extracted by SageMaker) is only read.
USER 1000:1000

EXPOSE 8080

# Exec form: `docker run IMAGE` and SageMaker's `docker run IMAGE serve` both start the stack.
ENTRYPOINT ["/opt/program/serve"]
