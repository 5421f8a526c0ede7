"""The OpenAI-compatible server (`unmask serve`) over the request-level engine."""
