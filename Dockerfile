# The router as an image: Python and its dependencies, entry point `pgrouter`.
# PostgreSQL and Kafka are the user's own; point the config at them.
FROM python:3.11-slim
WORKDIR /app
COPY pyproject.toml README.md ./
COPY router ./router
COPY actors ./actors
COPY configs ./configs
RUN pip install --no-cache-dir '.[librdkafka]' && useradd --create-home pgrouter
USER pgrouter
ENTRYPOINT ["pgrouter"]
CMD ["--help"]
