"""moto inverts a FIFO group's order when the group's messages time out together.

With moto in process (no server): a FIFO queue with a one-second visibility timeout; three
messages sent in one group, g-1, g-2 and g-3; one receive takes all three and nothing deletes
them, as if their consumer died; after the visibility timeout, the next receive should hand out
g-1 first, as SQS does. moto as shipped hands out g-3 alone: its pass forgets a message in
flight only when it reaches it visible again, and then skips it because g-2 and g-3, not yet
reached, still hold the group. The same steps on moto as the tests run it
(moto_sqs.py's install()) hand out g-1, g-2, g-3.

Prints what each receive handed out and the tag naming the breach that moto_sqs.py puts on
the queue, the tag the FIFO order test reads; exits 0 when moto as shipped inverts the group
and the tests' moto does not, else 1 saying which did what. Run as `python moto_fifo_order.py`
with a Python that has moto[server] (`brokers::sqs_fifo::moto_inverts_a_group_timed_out_together`
runs it).
"""

import os
import sys
import time

import boto3
import moto
from moto import mock_aws
from moto.core import DEFAULT_ACCOUNT_ID

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import moto_sqs  # noqa: E402

SENT = ["g-1", "g-2", "g-3"]
VISIBILITY_TIMEOUT = 1


def after_a_timeout(name, installed):
    """What a receive hands out once the group's messages, received and abandoned, time out;
    and the tags naming the order breaches moto_sqs.py found in it."""
    with mock_aws():
        sqs = boto3.client(
            "sqs",
            region_name="us-east-1",
            aws_access_key_id="test",
            aws_secret_access_key="test",
        )
        url = sqs.create_queue(
            QueueName=f"{name}.fifo",
            Attributes={
                "FifoQueue": "true",
                "VisibilityTimeout": str(VISIBILITY_TIMEOUT),
            },
        )["QueueUrl"]
        for body in SENT:
            sqs.send_message(
                QueueUrl=url,
                MessageBody=body,
                MessageGroupId="g",
                MessageDeduplicationId=body,
            )
        first = sqs.receive_message(QueueUrl=url, MaxNumberOfMessages=10)
        assert [m["Body"] for m in first.get("Messages", [])] == SENT, first
        # The consumer died holding all three: nothing deletes them.
        time.sleep(VISIBILITY_TIMEOUT + 0.5)
        backend = moto.sqs.models.sqs_backends[DEFAULT_ACCOUNT_ID]["us-east-1"]
        queue = backend.get_queue(f"{name}.fifo")
        received = backend.receive_message(f"{name}.fifo", 10, 0, VISIBILITY_TIMEOUT)
        if not installed:
            # What the tests' moto would do with this receive: name the breach on the queue.
            moto_sqs.record_breaches(queue, received)
        tags = sqs.list_queue_tags(QueueUrl=url).get("Tags", {})
        breaches = {k: v for k, v in tags.items() if k.startswith(moto_sqs.BREACH_TAG)}
        return [m.body for m in received], breaches


def main():
    print(f"moto {moto.__version__}: {', '.join(SENT)} sent in group g, received, abandoned")
    shipped, shipped_breaches = after_a_timeout("shipped", installed=False)
    print(f"  moto as shipped, after the visibility timeout, hands out {shipped}")
    for tag, what in shipped_breaches.items():
        print(f"    {tag} = {what}")
    moto_sqs.install()
    tests, tests_breaches = after_a_timeout("tests", installed=True)
    print(f"  moto as the tests run it (moto_sqs.py) hands out {tests}")
    for tag, what in tests_breaches.items():
        print(f"    {tag} = {what}")
    ok = True
    if shipped == SENT or not shipped_breaches:
        # Not a failure: the tests' server keeps the order either way.
        print("moto as shipped keeps the group's order: moto_sqs.py's FIFO pass may go")
    if tests != SENT or tests_breaches:
        print("moto as the tests run it breaks the group's order")
        ok = False
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
