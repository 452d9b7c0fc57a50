"""Helpers shared by the rank-side workers."""


def expect(exc_type, words, call, r):
    """Runs `call`, which must raise `exc_type` with each of `words` in its
    message; prints the message (tagged with rank `r`) and returns it."""
    try:
        call()
    except exc_type as e:
        msg = str(e)
        for w in words:
            assert w in msg, f"expected {w!r} in: {msg}"
        print(f"rank {r} raised {exc_type.__name__}: {msg}", flush=True)
        return msg
    raise AssertionError(f"no {exc_type.__name__} for {words}")
