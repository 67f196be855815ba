# The fabric image: `agap` (workers, keeper, A2A gateway, CLI) and the LiteLLM proxy, at
# the versions the tests run. Cards and souls are baked in: they are code, deployed from
# git, never edited live in a volume. Rebuild after changing a card.
FROM python:3.12-slim

# Extras to install: `litellm` brings the proxy (and the in-process sdk mode).
ARG EXTRAS=litellm

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LITELLM_LOCAL_MODEL_COST_MAP=True \
    AGAP_CARDS_DIR=/app/cards \
    AGAP_STATE_DIR=/var/lib/agap

WORKDIR /app
COPY pyproject.toml README.md ./
COPY fabric ./fabric
COPY workers ./workers
COPY keeper ./keeper
RUN pip install ".[${EXTRAS}]"
COPY cards ./cards
COPY souls ./souls

# An unprivileged user; the state volume (a(t) counters, caches) is theirs.
RUN useradd --system --uid 10001 --home-dir /var/lib/agap --create-home agap \
    && mkdir -p /var/lib/agap/.cache && chown -R agap /var/lib/agap
USER agap
ENV XDG_CACHE_HOME=/var/lib/agap/.cache

# Every service names its command (agap worker/keeper/a2a serve, or litellm).
CMD ["agap", "--help"]
