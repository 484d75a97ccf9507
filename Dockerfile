# The router as an image: Python and its dependencies, entry point `pgrouter`.
# PostgreSQL and Kafka are the user's own; point the config at them.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml setup.py README.md ./
COPY router ./router
COPY actors ./actors
COPY configs ./configs
# gcc builds the C hot path (router/_native/, actors/kafka/_producer.c); it is removed again after the install
RUN apt-get update && apt-get install -y --no-install-recommends gcc libc6-dev \
    && pip install --no-cache-dir '.[librdkafka]' \
    && python -c 'import router._native, actors.kafka._producer' \
    && apt-get purge -y gcc libc6-dev && apt-get autoremove -y && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home pgrouter
USER pgrouter
ENTRYPOINT ["pgrouter"]
CMD ["--help"]
