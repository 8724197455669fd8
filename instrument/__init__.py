"""tokentrace instrumentation: KV math, traced generate, tracing setup."""
