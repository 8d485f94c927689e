# Redis from Debian's package, for hosts that reach no container registry.
FROM debian:bookworm-slim
RUN apt-get update -qq \
 && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends redis-server >/dev/null \
 && rm -rf /var/lib/apt/lists/*
WORKDIR /data
VOLUME /data
EXPOSE 6379
LABEL runbox.component=redis
# AOF with an fsync every second: a crash loses at most a second of
# acknowledged writes, which the run leases and the sweep already tolerate.
CMD ["redis-server", "--appendonly", "yes", "--appendfsync", "everysec", "--dir", "/data", "--bind", "0.0.0.0", "--protected-mode", "no"]
