"""The sentence-transformers peer of bench/embeddings.sh: the same model
behind a minimal FastAPI app speaking OpenAI's /v1/embeddings (float
vectors), one process, torch on the threads given.

    python st_server.py MODEL_DIR PORT THREADS
"""
import sys

import torch
import uvicorn
from fastapi import FastAPI
from pydantic import BaseModel
from sentence_transformers import SentenceTransformer

model_dir, port, threads = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
torch.set_num_threads(threads)
model = SentenceTransformer(model_dir, device="cpu")
app = FastAPI()


class Req(BaseModel):
    model: str
    input: str | list[str]


@app.get("/v2/health/ready")
def ready():
    return {}


@app.post("/v1/embeddings")
def embeddings(req: Req):
    texts = [req.input] if isinstance(req.input, str) else req.input
    with torch.inference_mode():
        vecs = model.encode(texts, normalize_embeddings=True, batch_size=64)
    return {"object": "list", "model": req.model,
            "data": [{"object": "embedding", "index": i, "embedding": v.tolist()} for i, v in enumerate(vecs)],
            "usage": {"prompt_tokens": 0, "total_tokens": 0}}


uvicorn.run(app, host="127.0.0.1", port=port, log_level="warning")
