"""A trained model in use: `lab sample`, `lab eval`, `lab export` and "Try the model".

By concern: `loading` (a run or a checkpoint, with the tokenizer it was trained with, on a GPU
in the card's precision or on the CPU in fp32), `sampling` (the settings, the streamed text;
the KV cache itself is the kernel's, `lab.kernel.model`), `texts` and `evaluate` (loss per
token and bits per byte on a file, a folder or a constellation's val split), `bpb` (the
tokenizer-free scale and the val bits per byte of runs), `export` and `card` (safetensors,
config, tokenizer and the model card).

Nothing is imported here: `lab runs` and the runs panel read `bpb` without torch.
"""
