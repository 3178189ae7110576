"""`nanoengine serve`: an OpenAI-compatible HTTP server (FastAPI + uvicorn) on the live engine loop."""
