"""moto's server mode for the SQS tests, with its races closed and SQS's FIFO order kept.

moto's Queue.delete_message rebuilds the queue's list of messages and assigns it back, with no
lock: two DeleteMessage calls at once (or a delete and a SendMessage) can put back a message
the other deleted, or drop a message just sent. A lost delete makes a settled message come back
after its visibility timeout, which SQS itself does not do for a delete it acknowledged. Here
every change to a queue's list of messages is made under one lock.

moto's ReceiveMessage reads which FIFO message groups have a message in flight once, then picks
messages, with no lock: two receives at once can each take messages of one group (the first
`a-1`, the second `a-2`), which SQS never hands out while `a-1` is in flight, so that a group's
messages run at once and out of order. And it forgets a message in flight only when a pass
reaches it visible again, then counts the groups in flight anew: when several messages of a
group time out together, the pass skips each but the last, as its group still looks in flight,
and hands out the last and those after it first (moto_fifo_order.py beside this file shows it
with moto in process). SQS hands out a group's first message. Here each pass over a FIFO queue
is made under the same lock, reads the clock once, and first forgets every message in flight
whose visibility timeout ended by then, so that moto's pass never meets one (with the clock
read anew, messages whose timeout ended between the forgetting and moto's pass would meet it);
a long poll waits between passes without the lock.

Each FIFO receive is then checked against SQS's rule: the messages it hands out of a group are
the group's first ones not yet deleted, in order. A breach is printed, and a group's first is
kept as a tag on the queue, `moto-fifo-order-broken:<group>` (ListQueueTags shows it), so that
a test finding a group out of order can tell the server's fault from the consumer's.

The rest is moto as shipped.

Run as `python moto_sqs.py -H 127.0.0.1 -p 9324`, with the arguments of moto_server.
"""

import sys
import threading
import time

from moto.sqs import models

# The tag a breach of a FIFO group's order is kept under, followed by the group's id.
BREACH_TAG = "moto-fifo-order-broken:"

_LOCK = threading.RLock()
_PASS = threading.local()
_clock_millis = models.unix_time_millis
_receive_message = models.SQSBackend.receive_message


def _locked(method):
    def run_locked(self, *args, **kwargs):
        with _LOCK:
            return method(self, *args, **kwargs)

    run_locked.__name__ = method.__name__
    return run_locked


def _now_millis(*args):
    # Within a FIFO pass, the instant the pass began: which messages are visible is decided
    # once per pass. Elsewhere, and for other threads meanwhile, the clock.
    frozen = getattr(_PASS, "millis", None)
    if frozen is None or args:
        return _clock_millis(*args)
    return frozen


def _label(message):
    return message.deduplication_id or message.id


def fifo_order_breaches(queue, received):
    """How `received`, just handed out of FIFO `queue`, breaks SQS's order: (group, what) each.

    SQS hands out a group's messages from its first one not yet deleted, in order, and none of
    a group while one of it is in flight; so the messages a receive hands out of a group are
    that group's first ones still in the queue.
    """
    handed = {}
    for message in received:
        if message.group_id is not None:
            handed.setdefault(message.group_id, []).append(_label(message))
    breaches = []
    for group, labels in handed.items():
        first = [_label(m) for m in queue._messages if m.group_id == group][: len(labels)]
        if labels != first:
            breaches.append(
                (group, f"handed out {', '.join(labels)} where SQS hands out {', '.join(first)}")
            )
    return breaches


def record_breaches(queue, received):
    """Prints each breach of `fifo_order_breaches` and tags `queue` with a group's first."""
    for group, what in fifo_order_breaches(queue, received):
        print(f"moto_sqs: {queue.name}: group {group}: {what}", file=sys.stderr, flush=True)
        # SQS's limits on a tag's key and value.
        queue.tags.setdefault(f"{BREACH_TAG}{group}"[:128], what[:256])


def _receive_atomically(
    self, queue_name, count, wait_seconds_timeout, visibility_timeout, *args, **kwargs
):
    # Standard queues have no groups to keep in order: moto's own receive, as shipped.
    if not self.get_queue(queue_name).fifo_queue:
        return _receive_message(
            self, queue_name, count, wait_seconds_timeout, visibility_timeout, *args, **kwargs
        )
    deadline = time.monotonic() + wait_seconds_timeout
    while True:
        # One pass, no wait, at one instant: the groups in flight are read and messages taken
        # at once.
        with _LOCK:
            _PASS.millis = _clock_millis()
            try:
                queue = self.get_queue(queue_name)
                for message in [m for m in queue.pending_messages if m.visible]:
                    queue.pending_messages.discard(message)
                received = _receive_message(
                    self, queue_name, count, 0, visibility_timeout, *args, **kwargs
                )
                record_breaches(queue, received)
            finally:
                _PASS.millis = None
        if received or time.monotonic() >= deadline:
            return received
        time.sleep(0.05)


def install():
    """Makes moto's SQS in this process the tests' server: the changes above."""
    models.unix_time_millis = _now_millis
    models.Queue.delete_message = _locked(models.Queue.delete_message)
    models.Queue.add_message = _locked(models.Queue.add_message)
    models.SQSBackend.receive_message = _receive_atomically


if __name__ == "__main__":
    from moto.server import main

    install()
    sys.exit(main())
