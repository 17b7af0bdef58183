"""How the lesson's tests report a wrong result: the first element that differs, with the rank,
the chunk or parameter and the index, expected against actual, in the failure's first line.

    assert_same(got, want, "rank 0, reduce-scatter of 6 float32", chunk=2, allowed=0.0)
    -> AssertionError: rank 0, reduce-scatter of 6 float32: chunk 1, index 0: expected 5, got -3
       (2 of 6 elements differ, by up to 8; allowed 0)
"""
import torch


def allowed_gaps(want, atol=0.0, rtol=0.0):
    """Each element's tolerance, as torch.testing.assert_close's: atol + rtol * |expected|."""
    return atol + rtol * want.to(torch.float64).abs()


def differing(got, want, atol=0.0, rtol=0.0):
    """A flat boolean mask of the elements of `got` out of tolerance of `want`'s (NaN where the
    other is not NaN differs)."""
    got64, want64 = got.to(torch.float64).reshape(-1), want.to(torch.float64).reshape(-1)
    gap = (got64 - want64).abs()
    wrong = gap > allowed_gaps(want64, atol, rtol)
    return wrong | (got64.isnan() != want64.isnan())


def place(index, shape, chunk):
    """Where flat element `index` is: 'chunk c, index i' (chunks of `chunk` elements), else the
    index in `shape`, as a tuple for more than one dimension."""
    if chunk:
        return f"chunk {index // chunk}, index {index % chunk}"
    if len(shape) <= 1:
        return f"index {index}"
    return f"index {tuple(int(i) for i in torch.unravel_index(torch.tensor(index), shape))}"


def difference_message(got, want, where, atol=0.0, rtol=0.0, chunk=None):
    """The failure's message where `got` is not `want` within tolerance; None where it is."""
    if tuple(got.shape) != tuple(want.shape):
        return f"{where}: shape {tuple(got.shape)}, expected {tuple(want.shape)}"
    wrong = differing(got, want, atol, rtol)
    if not wrong.any():
        return None
    index = int(wrong.nonzero()[0])
    expected, actual = want.reshape(-1)[index].item(), got.reshape(-1)[index].item()
    largest = (got.to(torch.float64) - want.to(torch.float64)).abs().nan_to_num(
        float("inf")).max().item()
    tolerance = f"{atol:.3g}" if not rtol else f"{atol:.3g} + {rtol:.3g} x |expected|"
    return (f"{where}: {place(index, tuple(got.shape), chunk)}: expected {expected:.7g}, "
            f"got {actual:.7g} ({int(wrong.sum())} of {wrong.numel()} elements differ, by up "
            f"to {largest:.3g}; allowed {tolerance})")


def assert_same(got, want, where, atol=0.0, rtol=0.0, chunk=None):
    """Fail with difference_message's line, first, where `got` is not `want` within tolerance;
    `chunk`: the elements per chunk, where the tensor is cut into the ranks' chunks."""
    __tracebackhide__ = True  # the failure points at the test's line, not at this helper
    message = difference_message(got, want, where, atol, rtol, chunk)
    if message:
        raise AssertionError(message)


def assert_none(messages):
    """Fail with every difference_message of a rank's cases, one a line, the first first."""
    __tracebackhide__ = True  # the failure points at the test's line, not at this helper
    if messages:
        raise AssertionError("\n".join(messages))
