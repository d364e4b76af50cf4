"""The padded sizes of a step: few, covering every step, requests never more than tokens."""

from torch_pjrt_vllm.buckets import request_bucket, token_bucket, token_buckets


def test_every_step_size_has_a_bucket_in_the_warmup_list():
    sizes = token_buckets(256)
    assert sizes == [16, 32, 64, 128, 256]
    for n in range(1, 257):
        assert token_bucket(n) in sizes and token_bucket(n) >= n


def test_a_budget_that_is_not_a_power_of_two_is_covered():
    assert token_buckets(100) == [16, 32, 64, 128]
    assert token_bucket(100) == 128


def test_requests_fit_their_token_bucket_and_the_batch_limit():
    for n in range(1, 300):
        r = request_bucket(n, max_num_seqs=12)
        assert r <= token_bucket(n) and r <= 16
        assert r >= min(n, 12)  # a step of n tokens has at most n requests
