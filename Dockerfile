# syntax=docker/dockerfile:1
# oomwatch node agent image, for those with a Docker engine and a registry to pull python:3.11 from:
#   docker build -t REGISTRY/oomwatch:$(python3 -c 'import oomwatch; print(oomwatch.__version__)') .
# scripts/build-image makes the image the tests run (docs/release.md): the same wheels, pinned by the same
# constraints.txt, on Debian bookworm's python3 (3.11) from Debian packages instead of the python:3.11 image.
#
# Builder stage: builds the oomwatch wheel and the wheels of its dependencies at the tested versions.
FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md LICENSE constraints.txt ./
COPY oomwatch ./oomwatch
RUN pip wheel --wheel-dir /wheels -c constraints.txt .

# Runtime stage: the wheels installed into a slim Python, nothing else (no compiler, no source).
FROM python:3.11-slim-bookworm
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1 \
    PYTHONUNBUFFERED=1 PYTHONDONTWRITEBYTECODE=1
RUN --mount=type=bind,from=build,source=/wheels,target=/wheels \
    pip install --no-index --find-links=/wheels oomwatch \
    && groupadd --system --gid 65532 oomwatch \
    && useradd --system --uid 65532 --gid 65532 --home-dir /nonexistent --no-create-home \
       --shell /usr/sbin/nologin oomwatch \
    && oomwatch --version
# The image runs as an unprivileged user by default: `oomwatch inspect --kmsg -` on a saved log, or
# the agent where kernel.dmesg_restrict=0, needs nothing more. Reading /dev/kmsg under
# dmesg_restrict=1 needs CAP_SYSLOG in the effective set, which a non-root user cannot get without
# ambient capabilities (Kubernetes has none, and no_new_privs blocks file capabilities), so the
# DaemonSet runs this image as uid 0 with every capability dropped but SYSLOG (daemonset/daemonset.yaml).
USER 65532:65532
EXPOSE 9717
STOPSIGNAL SIGTERM
ENTRYPOINT ["oomwatch"]
CMD ["agent"]
