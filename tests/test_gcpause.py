"""gc_paused: nested and overlapping pauses turn the collector back on only at the
end of the last one, and never when the caller had it off."""

import gc
import threading

from pynnet3.gcpause import gc_paused


def test_nested_pauses_restore_at_the_outermost_end():
    assert gc.isenabled()
    with gc_paused():
        with gc_paused():
            assert not gc.isenabled()
        assert not gc.isenabled()  # the outer pause still holds
    assert gc.isenabled()


def test_overlapping_pauses_in_two_threads():
    inside, release = threading.Event(), threading.Event()
    seen = []

    def other():
        with gc_paused():
            inside.set()
            release.wait(5)

    t = threading.Thread(target=other)
    with gc_paused():
        t.start()
        inside.wait(5)
    seen.append(gc.isenabled())  # our pause ended, the other thread's has not
    release.set()
    t.join(5)
    seen.append(gc.isenabled())
    assert seen == [False, True]


def test_a_caller_that_disabled_the_collector_keeps_it_off():
    gc.disable()
    try:
        with gc_paused():
            pass
        assert not gc.isenabled()
    finally:
        gc.enable()


def test_start_up_pause_ends_with_the_start_up_objects_frozen():
    from pynnet3.gcpause import pause_start_up, start_up_done

    assert gc.isenabled()
    frozen = gc.get_freeze_count()
    try:
        pause_start_up()
        assert not gc.isenabled()
        pause_start_up()  # (a second call changes nothing)
        start_up_done()
        assert gc.isenabled() and gc.get_freeze_count() > frozen
        start_up_done()  # (no pause on: nothing)
        assert gc.isenabled()
    finally:
        gc.unfreeze()
        gc.enable()


def test_start_up_pause_leaves_a_collector_that_was_off_alone():
    from pynnet3.gcpause import pause_start_up, start_up_done

    gc.disable()
    try:
        pause_start_up()
        start_up_done()
        assert not gc.isenabled() and gc.get_freeze_count() == 0
    finally:
        gc.enable()
