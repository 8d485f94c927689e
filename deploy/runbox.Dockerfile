# The api and executor binaries (built on the host by deploy/build.sh, so
# that no Go toolchain image is needed) on the same base as the runners.
FROM debian:bookworm-slim
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends ca-certificates >/dev/null \
 && rm -rf /var/lib/apt/lists/*
COPY build/api build/executor /usr/local/bin/
# The runner images built with this one (deploy/runners-list.sh), which
# executors on Kubernetes offer (SANDBOX_RUNNERS_FILE).
COPY build/runners.json /etc/runbox/runners.json
LABEL runbox.component=service
CMD ["api"]
