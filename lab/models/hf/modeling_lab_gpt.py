"""The lab kit's GPT for Hugging Face transformers (`AutoModelForCausalLM`, `generate()`).

Shipped beside the weights of a `lab export`; config.json's `auto_map` names it, so
`trust_remote_code=True` loads it. It imports torch and transformers only, never `lab`. The
arithmetic is the kit's `lab/kernel/model.py`, line for line, so the logits are the kit's: RMS
norm without weights, learned positions, a 4·d MLP, no biases, the output head tied to the
token embedding. The modules carry the kit's names, so the export's model.safetensors is the
kit's own state dict, read by both.

The cache is transformers' own (`DynamicCache`, or whatever `generate()` passes). Past the
context n the window slides as in `lab sample`: the positions are learned and absolute, so every
one shifts and nothing cached stays valid; each new token then recomputes the last n tokens.
A batch with padding (an attention mask with zeros; pad on the left to generate) masks the
pads out and counts positions from each row's first real token.
"""
import math

import torch
import torch.nn as nn
import torch.nn.functional as F
from transformers import GenerationMixin, PreTrainedModel
from transformers.cache_utils import DynamicCache
from transformers.modeling_outputs import CausalLMOutputWithPast

from .configuration_lab_gpt import LabGPTConfig

# transformers 5.24 renamed `past_key_values` to `cache` (in the forward's arguments and its
# output): take either, and answer under the name the installed release reads.
CACHE = "cache" if "cache" in getattr(CausalLMOutputWithPast, "__dataclass_fields__", {}) else "past_key_values"


def norm(x: torch.Tensor) -> torch.Tensor:
    return F.rms_norm(x, (x.size(-1),))


def attention_mask_4d(keep: torch.Tensor, t: int) -> torch.Tensor:
    """(batch, 1, t, keys) booleans: the last `t` positions see the earlier ones that `keep`
    keeps, and themselves (so a padding position's row is never empty)."""
    n = keep.size(-1)
    q = torch.arange(n - t, n, device=keep.device)[:, None]
    k = torch.arange(n, device=keep.device)[None, :]
    return ((k <= q) & keep.bool()[:, None, None, :]) | (k == q)


class Attention(nn.Module):
    def __init__(self, width: int, heads: int, layer: int):
        super().__init__()
        self.heads, self.layer = heads, layer
        self.qkv = nn.Linear(width, 3 * width, bias=False)
        self.proj = nn.Linear(width, width, bias=False)
        self.proj.residual = True  # initialised smaller (`_init_weights`)

    def forward(self, x, cache=None, mask=None):
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        if cache is not None:
            k, v = cache.update(k, v, self.layer)
        if mask is None:  # the kit's own call: causal over a whole sequence; one new token sees all
            y = F.scaled_dot_product_attention(q, k, v, is_causal=t > 1)
        else:
            y = F.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        return self.proj(y.transpose(1, 2).contiguous().view(b, t, d))


class MLP(nn.Module):
    def __init__(self, width: int):
        super().__init__()
        self.up = nn.Linear(width, 4 * width, bias=False)
        self.down = nn.Linear(4 * width, width, bias=False)
        self.down.residual = True

    def forward(self, x):
        return self.down(F.gelu(self.up(x)))


class Block(nn.Module):
    def __init__(self, width: int, heads: int, layer: int):
        super().__init__()
        self.attn = Attention(width, heads, layer)
        self.mlp = MLP(width)

    def forward(self, x, cache=None, mask=None):
        x = x + self.attn(norm(x), cache, mask)
        return x + self.mlp(norm(x))


class LabGPTForCausalLM(PreTrainedModel, GenerationMixin):
    config_class = LabGPTConfig
    main_input_name = "input_ids"
    _no_split_modules = ["Block"]

    def __init__(self, config: LabGPTConfig):
        super().__init__(config)
        width, heads = config.hidden_size, config.num_attention_heads
        if width % heads:
            raise ValueError(f"width {width} does not divide by heads {heads}")
        self.context = config.max_position_embeddings
        self.tok = nn.Embedding(config.vocab_size, width)
        self.pos = nn.Embedding(self.context, width)
        self.blocks = nn.ModuleList(Block(width, heads, i) for i in range(config.num_hidden_layers))
        self.post_init()

    def _init_weights(self, module):
        # The kit's initialisation, for weights a checkpoint lacks (from_config, resized vocabularies).
        if isinstance(module, (nn.Linear, nn.Embedding)):
            std = 0.02
            if getattr(module, "residual", False):
                std /= math.sqrt(2 * self.config.num_hidden_layers)  # GPT-2: residual branches scaled by depth
            nn.init.normal_(module.weight, mean=0.0, std=std)

    def get_input_embeddings(self):
        return self.tok

    def set_input_embeddings(self, value):
        self.tok = value

    def forward(self, input_ids=None, attention_mask=None, position_ids=None, cache=None, past_key_values=None,
                inputs_embeds=None, labels=None, use_cache=None, **kwargs):
        """Logits for the tokens after those in the cache; with `labels`, also the mean
        cross-entropy of each token's prediction of the next (labels -100 are skipped)."""
        cache = cache if cache is not None else past_key_values
        use_cache = self.config.use_cache if use_cache is None else use_cache
        x = self.tok(input_ids) if inputs_embeds is None else inputs_embeds
        t = x.size(1)
        if use_cache and cache is None:
            cache = DynamicCache()
        past = cache.get_seq_length() if cache is not None else 0
        if past + t > self.context:
            raise ValueError(f"sequence of {past + t} tokens is longer than the context {self.context}")
        padded = attention_mask is not None and not bool(attention_mask.all())
        if position_ids is None:
            position_ids = ((attention_mask.long().cumsum(-1)[:, -t:] - 1).clamp(min=0) if padded
                            else torch.arange(past, past + t, device=x.device)[None])
        x = x + self.pos(position_ids)
        mask = None
        if padded or (past and t > 1):  # else the kit's exact call (is_causal), the same arithmetic
            keep = attention_mask if attention_mask is not None else x.new_ones(x.size(0), past + t)
            mask = attention_mask_4d(keep, t)
        for block in self.blocks:
            x = block(x, cache, mask)
        logits = F.linear(norm(x), self.tok.weight)  # tied output head
        loss = None
        if labels is not None:
            loss = F.cross_entropy(logits[:, :-1].float().reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1),
                                   ignore_index=-100)
        return CausalLMOutputWithPast(loss=loss, logits=logits, **{CACHE: cache if use_cache else None})

    def prepare_inputs_for_generation(self, input_ids, **kwargs):
        inputs = super().prepare_inputs_for_generation(input_ids, **kwargs)
        if inputs.get("input_ids") is None:  # a prompt given as embeddings: as it is
            return inputs
        key = "cache" if "cache" in inputs else "past_key_values"
        cache, new = inputs.get(key), inputs["input_ids"].size(1)
        past = cache.get_seq_length() if cache is not None else 0
        if past == input_ids.size(1) - new and past + new <= self.context:
            return inputs
        # Past the context: the last n tokens again, without the cache (lab sample's rule). The
        # cache is left as it is, and every later token comes here too.
        inputs.update({"input_ids": input_ids[:, -self.context:], key: None, "use_cache": False})
        inputs.pop("position_ids", None)
        if inputs.get("attention_mask") is not None:
            inputs["attention_mask"] = inputs["attention_mask"][:, -self.context:]
        return inputs
