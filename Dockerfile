# syntax=docker/dockerfile:1
#
# The Reversi operator image (and, with --target demo, the demo's tools image).
#
#   docker build -t ghcr.io/reversi-dev/reversi-operator:0.1.0 .
#   docker build --target demo -t reversi-demo-tools:dev .
#
# The operator runs as user 65532 (named reversi) on a read-only root file system (the chart mounts /tmp);
# its entry point is `reversi-operator` (settings from REVERSI_* variables, see the chart).

ARG PYTHON_IMAGE=python:3.11-slim

# ---- build: a wheel of the project and of every dependency --------------------------------
FROM ${PYTHON_IMAGE} AS build
ENV PIP_NO_CACHE_DIR=1 PIP_DISABLE_PIP_VERSION_CHECK=1
WORKDIR /src
# README.md is optional here (pyproject names it; the glob keeps the build working without it)
COPY pyproject.toml README.md* ./
# the dependencies first, from the project's metadata alone (an empty package stands in), so a
# change to the code rebuilds only the project's own wheel
RUN test -f README.md || echo "Reversi" > README.md \
 && mkdir -p operator/reversi && touch operator/reversi/__init__.py \
 && pip wheel --wheel-dir /wheels ".[gateway,archive]" && rm /wheels/reversi-*.whl \
 && rm -rf build operator *.egg-info
# (setuptools' build/ copies a module only when the source is newer than its copy there: the stand-in
# package's build/ would shadow the real package's __init__.py, whose mtime comes from the checkout)
COPY operator ./operator
# the context's digest (below) here too: buildah's bind mount of a stage built wholly from its layer
# cache is empty, so an edit of the runtime stage alone must build this last step again
ARG SOURCE_DIGEST=""
RUN echo "context ${SOURCE_DIGEST}" && pip wheel --no-deps --wheel-dir /wheels .

# ---- runtime ------------------------------------------------------------------------------
FROM ${PYTHON_IMAGE} AS runtime
# A digest of the build context, for builders whose layer cache does not follow the bind mount
# below (buildah 1.28): a new value runs the install again. Docker's BuildKit needs none.
ARG SOURCE_DIGEST=""
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    HOME=/tmp
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels "reversi[gateway,archive]" \
 && python -c "import reversi.entrypoints.operator, reversi.entrypoints.admission, reversi.entrypoints.kube_runner, \
reversi.gateway.proxy, reversi.gateway.runner; assert reversi.__version__ != '0+unknown'" \
 && command -v reversi-operator reversi-gateway reversi-mcp-runner reversi-kube-runner \
 && useradd --system --uid 65532 --user-group --home-dir /tmp --no-create-home --shell /usr/sbin/nologin reversi
USER 65532:65532
EXPOSE 8080 9443

# ---- demo: the operator image plus the demo's downstream server and tool command ----------
# (stdlib-only scripts; compensator and reader Jobs of the demo run `python /opt/reversi/demo/tool.py`;
# the MCP shop, demo/mcp_shop/server.py, uses the image's mcp SDK)
FROM runtime AS demo
COPY --chown=0:0 --chmod=0755 demo/downstream/server.py demo/downstream/tool.py /opt/reversi/demo/
COPY --chown=0:0 --chmod=0755 demo/mcp_shop/server.py /opt/reversi/demo/mcp_shop.py
ENTRYPOINT []
CMD ["python", "/opt/reversi/demo/server.py", "--host", "0.0.0.0", "--port", "8080"]

# ---- operator (the default target: the last stage) ----------------------------------------
FROM runtime AS operator
LABEL org.opencontainers.image.title="reversi-operator" \
      org.opencontainers.image.description="Undoes the side effects of automated runs and says honestly what it could not undo." \
      org.opencontainers.image.source="https://github.com/reversi-dev/reversi" \
      org.opencontainers.image.licenses="Apache-2.0"
ENTRYPOINT ["reversi-operator"]
