"""``Guard``'s actor options declared wrong: a clear error when the actor is declared, before any
message is sent. (Declaring an actor talks to no broker.)"""

from __future__ import annotations

import dramatiq
import pytest
from dramatiq.brokers.redis import RedisBroker
from dramatiq.middleware import TimeLimit

import jobguard
import jobguard.dramatiq


def connect():
    raise AssertionError("not called: the actor is only declared")


def test_an_actor_with_a_key_and_no_database_is_refused():
    broker = RedisBroker(url="redis://127.0.0.1:6379/0")
    broker.add_middleware(jobguard.dramatiq.Guard())
    with pytest.raises(jobguard.dramatiq.GuardOptionsError, match="needs guard_key= and guard_db="):
        dramatiq.actor(guard_key=lambda order: jobguard.key("credit", order), broker=broker)(
            lambda conn, order: None
        )


def test_a_broker_without_retries_is_refused():
    # Without Retries, a delivery whose transaction rolled back is acked: its job is lost.
    broker = RedisBroker(url="redis://127.0.0.1:6379/0", middleware=[TimeLimit()])
    broker.add_middleware(jobguard.dramatiq.Guard())
    with pytest.raises(jobguard.dramatiq.GuardOptionsError, match="no Retries middleware"):
        dramatiq.actor(
            guard_key=lambda order: jobguard.key("credit", order), guard_db=connect,
            broker=broker,
        )(lambda conn, order: None)


def test_an_actor_without_guard_options_is_left_alone():
    broker = RedisBroker(url="redis://127.0.0.1:6379/0")
    broker.add_middleware(jobguard.dramatiq.Guard())

    def plain(order):
        return order

    actor = dramatiq.actor(broker=broker)(plain)
    assert actor.fn is plain
