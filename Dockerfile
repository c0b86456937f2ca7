# The serving image: NVIDIA Triton (TensorRT, ONNX Runtime and python backends), NGINX and the
# router, started by `serve`. Build the model repository for the target first (README, "Deploying
# to SageMaker"): the models/ copied in are the fallback when no ModelDataUrl is given.
#
# NGC 25.02: Ubuntu 24.04, Python 3.12 (the router needs Python 3.11 or later), TensorRT 10, CUDA
# compute capability 7.5 and later (T4 on g4dn, A10G on g5, L4 on g6). The router's tritonclient
# speaks Triton's stable gRPC API, so a newer server than the local 2.51 is fine.
FROM nvcr.io/nvidia/tritonserver:25.02-py3

# SageMaker's port variable is honoured; the container API for multi-model endpoints is served
# (SAGEMAKER_MULTI_MODEL=true: POST/GET/DELETE /models, POST /models/<name>/invoke).
LABEL com.amazonaws.sagemaker.capabilities.accept-bind-to-port=true \
      com.amazonaws.sagemaker.capabilities.multi-models=true

ENV DEBIAN_FRONTEND=noninteractive \
    PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    VIRTUAL_ENV=/opt/venv \
    PATH=/opt/venv/bin:/opt/program:$PATH

# NGINX in front of the router; python3-venv for the router's own environment (Ubuntu 24.04's
# system Python is externally managed). DL3008 (pin apt versions): the base image pins the
# distribution, and a pinned Ubuntu patch version disappears from the archive at its next
# security update, which would break every rebuild.
# hadolint ignore=DL3008
RUN apt-get update \
    && apt-get install -y --no-install-recommends nginx python3-venv \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/program

# Requirements first: code changes do not reinstall them.
COPY requirements.txt ./
RUN /usr/bin/python3 -m venv /opt/venv \
    && /opt/venv/bin/pip install --no-cache-dir -r requirements.txt

COPY serve nginx.conf ./
COPY app/ app/
COPY clients/ clients/
COPY models/ models/

# The image pipelines' python-backend steps (model.py in <model>_preprocess, <model>_postprocess)
# run the router's own clients: Triton's python stub takes the first python3 on PATH, the venv's,
# and this .pth puts /opt/program (app/, clients/) on that interpreter's path.
RUN echo /opt/program > "$(/opt/venv/bin/python -c 'import sysconfig; print(sysconfig.get_path("purelib"))')/opt-program.pth"

# The base image's non-root user, triton-server (uid and gid 1000; numeric, so the host need not
# resolve the name). NGINX listens on 8080 (SAGEMAKER_BIND_TO_PORT), above
# 1024, and `serve` keeps its runtime files in a fresh directory under /tmp; /opt/ml/model (the
# ModelDataUrl, extracted by SageMaker) is only read.
USER 1000:1000

EXPOSE 8080

# Exec form: `docker run IMAGE` and SageMaker's `docker run IMAGE serve` both start the stack.
ENTRYPOINT ["/opt/program/serve"]
