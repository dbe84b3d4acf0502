"""The kernel side: what the training notebook holds, on a bare Kaggle image (torch, numpy,
sentencepiece, matplotlib, and nothing of the control side).

The notebook reads as a story, then an appendix. `STORY` is pasted first, in this order: the
model, the data, the learning rate, one step, the loop, the time-limit saver; each of its modules
is defined with only the ones before it and calls the appendix's (where this process trains, the
speed-ups, the files) only inside its functions, which run once every cell has. `APPENDIX` follows
under the heading `## Appendix: the session's machinery`: the run's fields (`config` and `spec`
are `lab.config` and `lab.spec`, which the control side shares), the checkpoint's files, the
launcher, preflight, speed-ups, the CPU, signals and the session; each may use the story and the
appendix's modules before it."""

STORY = ["model", "data", "schedule", "step", "train", "saver"]
APPENDIX = ["config", "spec", "signals", "checkpoint", "metrics", "cpu", "ranks", "speed", "sync", "launch",
            "runtime", "fitting", "plots", "session", "preflight"]
READING_ORDER = STORY + APPENDIX
