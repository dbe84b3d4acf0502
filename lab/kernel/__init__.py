"""The kernel side: what the training notebook holds, pasted in this order (each module may use
only `lab.config` and the ones before it). It runs on a bare Kaggle image: torch, numpy,
sentencepiece, matplotlib, and nothing of the control side."""

READING_ORDER = ["model", "schedule", "data", "signals", "checkpoint", "metrics", "launch", "speed", "step", "loop",
                 "train", "plots", "session", "preflight"]
