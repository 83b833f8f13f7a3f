"""The library's signals keep their receivers: a lambda or a closure connected as the README shows is called."""

import gc
import weakref

from handofflock import signals


def _closure_receiver(heard: list):
    state = {"step": 7}

    def receiver(sender, **kw):
        heard.append(("closure", state["step"]))

    return receiver


def test_a_lambda_and_a_closure_connected_with_sender_are_still_called_after_a_collection(world):
    owner = world.lock("O")
    heard: list = []
    signals.acquired.connect(lambda s, **kw: heard.append("lambda"), sender=owner)
    signals.acquired.connect(_closure_receiver(heard), sender=owner)
    gc.collect()
    try:
        assert owner.acquire()
        assert sorted(heard, key=str) == [("closure", 7), "lambda"]  # blinker does not promise an order
        owner.release()
    finally:
        for receiver in list(signals.acquired.receivers_for(owner)):
            signals.acquired.disconnect(receiver, sender=owner)


def test_a_receiver_for_any_sender_stays_too_and_weak_true_still_means_weak(world):
    owner = world.lock("O")
    heard: list = []
    strong = lambda s, **kw: heard.append("strong")  # noqa: E731
    signals.released.connect(strong)
    signals.released.connect(lambda s, **kw: heard.append("weak"), weak=True)
    gc.collect()
    try:
        assert owner.acquire()
        owner.release()
        assert heard == ["strong"]
    finally:
        signals.released.disconnect(strong)


def test_a_strong_receiver_for_one_lock_does_not_keep_that_lock_alive(world):
    owner = world.lock("O")
    signals.lost.connect(lambda s, **kw: None, sender=owner)
    gone = weakref.ref(owner)
    del owner
    gc.collect()
    assert gone() is None
