"""The gateway's OpenAI-compatible HTTP front (what vLLM's server answers), served by the gateway
process on its own event loop and running the same request path as the gRPC API (router.py).

app.py: routes; front.py: what every route shares (auth, body, deadline, disconnects, errors);
generation.py, chat.py, completions.py, embeddings.py: the endpoints; schemas.py: bodies;
sampling.py: sampling fields; streaming.py: Server-Sent Events; errors.py: OpenAI's error shape;
server.py: uvicorn as a task of the gateway's loop.
"""
