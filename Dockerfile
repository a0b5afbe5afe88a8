# Multi-stage build: compile in the Rust image, run as a non-root user in a slim Debian image.
FROM rust:1-bookworm AS build
WORKDIR /src
COPY Cargo.toml Cargo.lock clippy.toml ./
COPY crates crates
COPY tests/e2e tests/e2e
COPY migrations migrations
# The `dist` profile (fat LTO): slower to build than `release`, faster to run (docs/performance.md). For a gateway
# built with profile-guided optimisation as well, see scripts/build-pgo.sh.
RUN cargo build --profile dist --locked -p gateway -p gateway-testkit \
 && cp target/dist/gateway target/dist/mock-model target/dist/example-tools target/dist/example-mcp \
    /usr/local/bin/

FROM debian:bookworm-slim
RUN apt-get update \
 && apt-get install -y --no-install-recommends ca-certificates \
 && rm -rf /var/lib/apt/lists/* \
 && useradd --system --uid 10001 --home-dir /app gateway
WORKDIR /app
COPY --from=build /usr/local/bin/gateway /usr/local/bin/mock-model /usr/local/bin/example-tools \
    /usr/local/bin/example-mcp /usr/local/bin/
COPY config config
RUN mkdir -p /app/data && chown gateway /app/data
USER gateway
EXPOSE 8080
ENTRYPOINT ["gateway"]
CMD ["serve"]
