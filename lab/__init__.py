"""The lab kit: train GPT language models from scratch on Kaggle's free GPUs and the lab's own cards."""
__version__ = "0.1.0"
