# The adapter as a container image.  Build and run:
#   docker build -t stomp-amqp-adapter .
#   docker run --rm -p 61613:61613 stomp-amqp-adapter --amqp-url amqp://guest:guest@<broker-host>:5672/
# or use docker-compose.yml, which also starts a RabbitMQ.
FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Only what `pip install .` needs (pyproject.toml names README.md as the readme); see .dockerignore.
COPY pyproject.toml README.md ./
COPY adapter ./adapter
RUN pip install . && rm -rf build ./*.egg-info

# The example ini file, for `--config /app/config/adapter.ini`.
COPY config ./config

RUN useradd --system --create-home --uid 10001 --user-group adapter
USER adapter

# STOMP (the default listener is 0.0.0.0:61613); metrics and health when
# STOMP_ADAPTER_HTTP_LISTEN=0.0.0.0:9613 is set (docker-compose.yml does).
EXPOSE 61613 9613

ENTRYPOINT ["stomp-amqp-adapter"]
# Command-line flags win over STOMP_ADAPTER_* variables: to configure the broker through
# STOMP_ADAPTER_AMQP_URL instead, replace this CMD (e.g. with `--log-level INFO`).
CMD ["--amqp-url", "amqp://guest:guest@rabbitmq:5672/"]
