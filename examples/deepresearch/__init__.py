"""A multi-turn search agent trained fully asynchronously: a generated offline world, BM25 retrieval
(in process or over HTTP), an OpenAI-API harness, an F1 reward and a Hydra `train.py`. See README.md."""
