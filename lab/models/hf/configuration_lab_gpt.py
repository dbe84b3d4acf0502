"""The configuration of the lab kit's GPT for Hugging Face transformers (`AutoConfig`).

Shipped beside the weights of a `lab export`, with `modeling_lab_gpt.py`; config.json names both
in its `auto_map`, so `trust_remote_code=True` loads them. It imports transformers only: the
folder loads where the lab kit is not installed.
"""
from transformers import PretrainedConfig


class LabGPTConfig(PretrainedConfig):
    """The sizes of the GPT under transformers' usual names: vocab, context n (the learned
    positions), width d, heads and layers."""

    model_type = "lab_gpt"

    def __init__(self, vocab_size: int = 4000, max_position_embeddings: int = 1024, hidden_size: int = 768,
                 num_attention_heads: int = 12, num_hidden_layers: int = 12, use_cache: bool = True, **kwargs):
        self.vocab_size = vocab_size
        self.max_position_embeddings = max_position_embeddings
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.num_hidden_layers = num_hidden_layers
        self.use_cache = use_cache
        kwargs.setdefault("tie_word_embeddings", True)  # the output head is the token embedding
        super().__init__(**kwargs)
