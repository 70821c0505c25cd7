# syntax=docker/dockerfile:1
# oomwatch node agent image:  docker build -t oomwatch/oomwatch:0.1.0 .
#
# Builder stage: builds the oomwatch wheel and the wheels of its dependencies.
FROM python:3.11-slim-bookworm AS build
ENV PIP_DISABLE_PIP_VERSION_CHECK=1 PIP_NO_CACHE_DIR=1
WORKDIR /src
COPY pyproject.toml README.md ./
COPY oomwatch ./oomwatch
RUN pip wheel --wheel-dir /wheels .

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
