"""The kernel side: what the training notebook holds, pasted in this order (each module may use
only the ones before it; `config` is `lab.config`, the run's fields, pasted where the loop's parts
first need them). It runs on a bare Kaggle image: torch, numpy, sentencepiece, matplotlib, and
nothing of the control side."""

READING_ORDER = ["model", "schedule", "data", "signals", "checkpoint", "metrics", "config", "cpu", "launch", "speed",
                 "step", "loop", "train", "plots", "session", "preflight"]
