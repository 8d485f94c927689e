# versitygw (Apache-2.0), the S3 server deploy/kubernetes keeps the
# conversations' files in: the binary `make test-deps` installs with
# `go install` (the version the Makefile names), copied into build/ by
# deploy/build.sh, on the same base as the other images.
FROM debian:bookworm-slim
COPY build/versitygw /usr/local/bin/versitygw
USER 65532:65532
LABEL runbox.component=versitygw
ENTRYPOINT ["versitygw"]
