"""moto's server mode for the SQS tests, with two races closed.

moto's Queue.delete_message rebuilds the queue's list of messages and assigns it back, with no
lock: two DeleteMessage calls at once (or a delete and a SendMessage) can put back a message
the other deleted, or drop a message just sent. A lost delete makes a settled message come back
after its visibility timeout, which SQS itself does not do for a delete it acknowledged. Here
every change to a queue's list of messages is made under one lock.

moto's ReceiveMessage reads which FIFO message groups have a message in flight once, then picks
messages, with no lock: two receives at once can each take messages of one group (the first
`a-1`, the second `a-2`), which SQS never hands out while `a-1` is in flight, so that a group's
messages run at once and out of order. And it forgets a message in flight only when a pass
reaches it visible again: when several messages of a group time out together, the pass skips
each but the last as its group still looks in flight, and hands out the last and those after it
first. Here each pass over the queue is made under the same lock, after forgetting every
message in flight whose visibility timeout ended, and a long poll waits between passes without
the lock.

The rest is moto as shipped.

Run as `python moto_sqs.py -H 127.0.0.1 -p 9324`, with the arguments of moto_server.
"""

import sys
import threading
import time

from moto.server import main
from moto.sqs import models

_LOCK = threading.RLock()


def _locked(method):
    def run_locked(self, *args, **kwargs):
        with _LOCK:
            return method(self, *args, **kwargs)

    run_locked.__name__ = method.__name__
    return run_locked


models.Queue.delete_message = _locked(models.Queue.delete_message)
models.Queue.add_message = _locked(models.Queue.add_message)

_receive_message = models.SQSBackend.receive_message


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
        # One pass, no wait: the groups in flight are read and messages taken at once.
        with _LOCK:
            queue = self.get_queue(queue_name)
            for message in [m for m in queue.pending_messages if m.visible]:
                queue.pending_messages.discard(message)
            received = _receive_message(
                self, queue_name, count, 0, visibility_timeout, *args, **kwargs
            )
        if received or time.monotonic() >= deadline:
            return received
        time.sleep(0.05)


models.SQSBackend.receive_message = _receive_atomically

if __name__ == "__main__":
    sys.exit(main())
