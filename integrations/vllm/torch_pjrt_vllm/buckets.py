"""The padded sizes of a model step: one compiled program per token bucket."""

from __future__ import annotations

MIN_TOKENS = 16


def _pow2(n: int) -> int:
    return 1 << max(0, n - 1).bit_length()


def token_bucket(num_tokens: int) -> int:
    """The padded token count of a step of `num_tokens` tokens (powers of two from 16)."""
    return max(MIN_TOKENS, _pow2(num_tokens))


def request_bucket(num_tokens: int, max_num_seqs: int) -> int:
    """The padded request count of a step of `num_tokens` tokens: fixed by the token bucket
    (so each token bucket is one program), at most the batch's request limit rounded up."""
    return min(token_bucket(num_tokens), _pow2(max_num_seqs))


def token_buckets(max_num_batched_tokens: int) -> list[int]:
    """Every token bucket a step of at most `max_num_batched_tokens` tokens can take."""
    sizes, n = [], MIN_TOKENS
    while n < token_bucket(max_num_batched_tokens):
        sizes.append(n)
        n *= 2
    return sizes + [token_bucket(max_num_batched_tokens)]


def page_bucket(pages: int, width: int) -> int:
    """The padded block-table width of a decode step whose longest request spans `pages`
    pages (powers of two, at most the table's `width`)."""
    return min(_pow2(max(1, pages)), width)


def page_buckets(width: int) -> list[int]:
    """Every page bucket of a table `width` pages wide."""
    return sorted({page_bucket(1 << i, width) for i in range(width.bit_length() + 1)})
