"""Indexing inside compiled graphs: boolean masks reach the lowering at static shapes
(eager turns them into indices first), and must give the CPU's values and errors."""

import warnings

import jax.numpy as jnp
import pytest
import torch

aten = torch.ops.aten


def _compiled_index_put(accumulate: bool):
    torch._dynamo.reset()
    return torch.compile(lambda x, i, v: aten.index_put(x, i, v, accumulate), backend="pjrt",
                         dynamic=False)


def _pjrt(indices):
    return [None if i is None else i.to("pjrt") for i in indices]


_M5 = torch.tensor([True, True, False, True, False])
_M6 = torch.tensor([True, False, True, True, False, True])

# (input shape, indices, values shape): masks alone, after a full dimension, of two
# dimensions, none true, with an integer index beside, values broadcast or one per True.
MASKED = [
    ((5, 6), [_M5], (6,)),
    ((5, 6), [_M5], (3, 6)),
    ((5, 6), [_M5], (3, 1)),
    ((5, 6), [None, _M6], (1,)),
    ((5, 6), [None, _M6], (5, 4)),
    ((5, 6), [torch.arange(30).reshape(5, 6) % 3 == 0], (10,)),
    ((5, 6), [torch.arange(30).reshape(5, 6) % 3 == 0], ()),
    ((5, 6), [torch.zeros(5, dtype=torch.bool)], (6,)),
    ((3, 5, 6), [None, _M5], (3, 3, 6)),
    ((3, 5, 6), [None, _M5, torch.tensor([0, 2, 5])], (3,)),
    ((5, 6), [_M5.to(torch.uint8)], (6,)),
]


@pytest.mark.parametrize("accumulate", [False, True])
@pytest.mark.parametrize("shape,indices,values", MASKED)
def test_index_put_with_a_mask_matches_cpu(shape, indices, values, accumulate):
    x, v = torch.randn(shape), torch.randn(values)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # uint8 masks are deprecated
        expected = aten.index_put(x, indices, v, accumulate)
        actual = _compiled_index_put(accumulate)(x.to("pjrt"), _pjrt(indices), v.to("pjrt"))
    torch.testing.assert_close(actual.cpu(), expected)


@pytest.mark.parametrize("indices,values,error", [
    ([_M5], (2, 6), RuntimeError),  # 2 values for 3 True
    ([None, _M5, torch.tensor([0, 2])], (1,), IndexError),  # 2 indices for 3 True
    ([None, _M5, torch.tensor([0, 2, 1, 1, 0])], (1,), IndexError),  # as many as the mask
])
def test_index_put_with_a_mask_raises_as_cpu(indices, values, error):
    x = torch.randn(5, 6) if len(indices) == 1 else torch.randn(3, 5, 6)
    v = torch.randn(values)
    with pytest.raises(error):
        aten.index_put(x, indices, v)
    out = _compiled_index_put(False)(x.to("pjrt"), _pjrt(indices), v.to("pjrt"))
    with pytest.raises(error, match="shape mismatch"):
        out.cpu()


def test_a_mask_where_the_result_shape_depends_on_it_raises_in_the_lowering():
    from torch_pjrt.lowering.families import indexing

    with pytest.raises(RuntimeError, match="boolean mask index"):
        indexing.index(jnp.zeros((3,)), [jnp.array([True, False, True])])
