"""The traced OpenAI-compatible gateway: FastAPI app, admission, model worker.

Import the submodules you need (``instrument.gateway.app`` needs FastAPI and, at run time,
torch); this package's ``__init__`` imports nothing heavy.
"""

__all__: list[str] = []
