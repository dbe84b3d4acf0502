import itertools

import pytest
import torch

from lab.config import weight_count
from lab.kernel.model import GPT


def test_reference_size_has_the_guides_weight_count():
    model = GPT(vocab=4000, context=1024, width=512, heads=8, layers=8)
    assert model.num_weights() == 27_738_112 == weight_count(8, 512, 4000, 1024)


@pytest.mark.parametrize("layers,width,heads,vocab,context", [
    (l, d, h, v, n) for (l, d, h), v, n in itertools.product(
        [(1, 32, 2), (2, 64, 4), (3, 96, 3), (12, 768, 12), (24, 1024, 16)], [256, 4000, 50257], [64, 2048])])
def test_weight_count_matches_the_formula_on_a_grid(layers, width, heads, vocab, context):
    with torch.device("meta"):
        model = GPT(vocab=vocab, context=context, width=width, heads=heads, layers=layers)
    assert model.num_weights() == 12 * layers * width**2 + vocab * width + context * width


def test_no_biases_and_norms_have_no_weights():
    model = GPT(vocab=100, context=16, width=32, heads=4, layers=2)
    assert all(p.dim() == 2 for p in model.parameters())


def test_output_head_is_tied_to_the_token_embedding():
    torch.manual_seed(0)
    model = GPT(vocab=100, context=16, width=32, heads=4, layers=1)
    idx = torch.randint(0, 100, (2, 8))
    logits = model(idx)
    with torch.no_grad():
        model.tok.weight[7] += 1.0
    assert not torch.allclose(model(idx)[..., 7], logits[..., 7])


def test_attention_is_causal():
    torch.manual_seed(0)
    model = GPT(vocab=50, context=16, width=32, heads=4, layers=2).eval()
    a = torch.randint(0, 50, (1, 10))
    b = a.clone()
    b[0, 6:] = (b[0, 6:] + 1) % 50
    torch.testing.assert_close(model(a)[:, :6], model(b)[:, :6])


def test_context_longer_than_the_model_is_refused():
    model = GPT(vocab=50, context=8, width=16, heads=2, layers=1)
    with pytest.raises(ValueError, match="longer than the context 8"):
        model(torch.zeros(1, 9, dtype=torch.long))
