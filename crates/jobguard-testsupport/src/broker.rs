//! The brokers the consumer and outbox tests run on, the cases of [`each_broker!`].

use crate::Service;

/// A broker of the tests' matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Broker {
    /// RabbitMQ.
    Rabbitmq,
    /// NATS JetStream.
    Nats,
    /// Redis Streams.
    Redis,
    /// Amazon SQS (moto's server).
    Sqs,
    /// Kafka (tansu).
    Kafka,
}

impl Broker {
    /// Every broker, in the order the matrix runs them.
    pub const ALL: [Broker; 5] = [
        Broker::Rabbitmq,
        Broker::Nats,
        Broker::Redis,
        Broker::Sqs,
        Broker::Kafka,
    ];

    /// The broker's name: its tests' names end in it, and so do their queues'.
    pub const fn name(self) -> &'static str {
        match self {
            Broker::Rabbitmq => "rabbitmq",
            Broker::Nats => "nats",
            Broker::Redis => "redis",
            Broker::Sqs => "sqs",
            Broker::Kafka => "kafka",
        }
    }

    /// Where the tests find it.
    pub fn service(self) -> Service {
        match self {
            Broker::Rabbitmq => Service::Amqp,
            Broker::Nats => Service::Nats,
            Broker::Redis => Service::Redis,
            Broker::Sqs => Service::Sqs,
            Broker::Kafka => Service::Kafka,
        }
    }

    /// The broker's URL when it answers; `None` (skip) otherwise, or a failed test on CI.
    pub fn url(self) -> Option<String> {
        self.service().url()
    }

    /// Whether a message whose effect committed and whose acknowledgement never came is
    /// delivered again (then as a duplicate): not on Kafka, where a consumer resumes after the
    /// offset stored with the effect.
    pub const fn redelivers_committed(self) -> bool {
        !matches!(self, Broker::Kafka)
    }
}
