# privmatch images from binaries built on this host, for fast rebuilds in tests and
# development: `bash deploy/stage.sh` lays them out in target/docker-stage, and the runtime
# images come from deploy/Dockerfile's party-runtime and coordinator-runtime targets
# (deploy/images.sh does both). The host's C library must match the runtime's (Debian 12).
ARG PARTY_RUNTIME=privmatch/party-runtime:local
ARG COORDINATOR_RUNTIME=privmatch/coordinator-runtime:local

FROM ${PARTY_RUNTIME} AS party
COPY target/docker-stage/ /

FROM ${COORDINATOR_RUNTIME} AS coordinator
COPY target/docker-stage/usr/local/bin/privmatch /usr/local/bin/privmatch
