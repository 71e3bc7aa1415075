"""The values nodes of one host send each other through their sockets (`txstream.nodes.mail`)."""

import threading

import numpy as np
import pytest
from txstream.errors import RuntimeFailure
from txstream.nodes.mail import Link, Listener, Mailbox, host


def test_values_sent_through_a_link_wait_in_the_mailbox_by_unit_level_and_sender():
    mailbox = Mailbox(node=1, timeout_s=5.0)
    listener = Listener(mailbox)
    first, second = Link(listener.name), Link(listener.name)
    try:
        second.send((7, 3, 2), np.array([5, -1], np.int64))
        first.send((7, 3, 0), np.arange(100_000, dtype=np.int64))  # more than a socket buffer
        first.send((7, 4, 0), np.zeros(0, np.int64))
        got = mailbox.take(7, 3, [0, 2])
        assert got[0].tolist() == list(range(100_000))
        assert got[1].tolist() == [5, -1]
        assert mailbox.take(7, 4, [0])[0].tolist() == []
    finally:
        first.close()
        second.close()
        listener.close()


def test_a_step_waits_for_values_that_arrive_later():
    mailbox = Mailbox(node=0, timeout_s=5.0)
    later = threading.Timer(0.2, mailbox.put, args=((1, 1, 1), np.array([9])))
    later.start()
    assert mailbox.take(1, 1, [1])[0].tolist() == [9]


def test_values_that_do_not_come_fail_the_step():
    mailbox = Mailbox(node=0, timeout_s=0.2)
    mailbox.put((1, 1, 1), np.array([9]))
    with pytest.raises(RuntimeFailure, match="no values from nodes"):
        mailbox.take(1, 1, [1, 2])


def test_a_process_knows_its_host():
    assert host() is not None  # Linux: nodes of one host use their sockets
