//! The provider's books: charges, idempotency keys, webhooks and failure switches.
//!
//! Everything here is synchronous and runs under the provider's mutex; the HTTP handlers do the
//! waiting between calls, never while holding the lock.

use std::collections::HashMap;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use crate::charge::{Charge, ChargeParams};
use crate::webhook::WebhookDelivery;

/// All mutable state of one provider.
#[derive(Debug)]
pub(crate) struct Ledger {
    charges: Vec<Charge>,
    keys: HashMap<String, KeyState>,
    webhooks: Vec<WebhookDelivery>,
    lookup_available: bool,
    failing_webhooks: u32,
}

impl Default for Ledger {
    fn default() -> Self {
        Self {
            charges: Vec::new(),
            keys: HashMap::new(),
            webhooks: Vec::new(),
            lookup_available: true,
            failing_webhooks: 0,
        }
    }
}

/// What the provider knows about one idempotency key.
#[derive(Debug)]
enum KeyState {
    /// A request with this key is being processed.
    InFlight,
    /// A request with this key created `charge` from `params` at `at`; its response is
    /// replayed until the key expires.
    Done {
        params: ChargeParams,
        charge: Charge,
        at: Instant,
    },
}

/// The answer to a request that claims an idempotency key.
#[derive(Debug)]
pub(crate) enum Claim {
    /// The key is new: it is now in flight and the caller must finish or release it.
    Claimed,
    /// The key was answered before with the same parameters: the original charge.
    Replay(Charge),
    /// The key was answered before with other parameters.
    Reused,
    /// Another request with this key is still being processed.
    InFlight,
}

impl Ledger {
    pub(crate) fn charges(&self) -> &[Charge] {
        &self.charges
    }

    pub(crate) fn webhooks(&self) -> &[WebhookDelivery] {
        &self.webhooks
    }

    pub(crate) fn lookup_available(&self) -> bool {
        self.lookup_available
    }

    pub(crate) fn set_lookup_available(&mut self, available: bool) {
        self.lookup_available = available;
    }

    pub(crate) fn fail_next_webhooks(&mut self, n: u32) {
        self.failing_webhooks = n;
    }

    /// Claims `key` for a request with `params`, as Stripe does: a stored response wins, then a
    /// request in flight, and only an unknown key is claimed. A key answered `ttl` or longer ago
    /// is forgotten first, as Stripe forgets keys after 24 hours: the request charges again.
    pub(crate) fn claim(
        &mut self,
        key: &str,
        params: &ChargeParams,
        ttl: Option<Duration>,
    ) -> Claim {
        if let (Some(ttl), Some(KeyState::Done { at, .. })) = (ttl, self.keys.get(key))
            && at.elapsed() >= ttl
        {
            self.keys.remove(key);
        }
        match self.keys.get(key) {
            Some(KeyState::Done {
                params: stored,
                charge,
                ..
            }) if stored == params => Claim::Replay(charge.clone()),
            Some(KeyState::Done { .. }) => Claim::Reused,
            Some(KeyState::InFlight) => Claim::InFlight,
            None => {
                self.keys.insert(key.to_owned(), KeyState::InFlight);
                Claim::Claimed
            }
        }
    }

    /// Frees a claimed key whose request was abandoned before it created anything.
    pub(crate) fn release(&mut self, key: &str) {
        if matches!(self.keys.get(key), Some(KeyState::InFlight)) {
            self.keys.remove(key);
        }
    }

    /// Creates a charge. With a key, also stores it as the key's response, in the same critical
    /// section, so no request ever sees the charge without the key being done.
    pub(crate) fn create_charge(&mut self, params: ChargeParams, key: Option<String>) -> Charge {
        let charge = Charge {
            id: format!("ch_{:06}", self.charges.len() + 1),
            order: params.order.clone(),
            amount: params.amount,
            idempotency_key: key.clone(),
            created_at_ms: now_ms(),
        };
        self.charges.push(charge.clone());
        if let Some(key) = key {
            let done = KeyState::Done {
                params,
                charge: charge.clone(),
                at: Instant::now(),
            };
            self.keys.insert(key, done);
        }
        charge
    }

    /// Spends one unit of the webhook failure budget; `true` means this webhook must fail.
    pub(crate) fn take_webhook_failure(&mut self) -> bool {
        if self.failing_webhooks == 0 {
            return false;
        }
        self.failing_webhooks -= 1;
        true
    }

    pub(crate) fn record_webhook(&mut self, delivery: WebhookDelivery) {
        self.webhooks.push(delivery);
    }
}

/// Milliseconds since the Unix epoch.
pub(crate) fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |elapsed| {
            u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
        })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn params(order: &str, amount: i64) -> ChargeParams {
        ChargeParams {
            order: order.to_owned(),
            amount,
        }
    }

    #[test]
    fn a_claimed_key_is_in_flight_until_the_charge_is_created() {
        let mut ledger = Ledger::default();
        assert!(matches!(
            ledger.claim("k", &params("o", 1), None),
            Claim::Claimed
        ));
        assert!(matches!(
            ledger.claim("k", &params("o", 1), None),
            Claim::InFlight
        ));
        let charge = ledger.create_charge(params("o", 1), Some("k".to_owned()));
        assert!(
            matches!(ledger.claim("k", &params("o", 1), None), Claim::Replay(c) if c == charge)
        );
        assert!(matches!(
            ledger.claim("k", &params("o", 2), None),
            Claim::Reused
        ));
        assert_eq!(ledger.charges().len(), 1);
    }

    #[test]
    fn release_frees_an_in_flight_key_but_not_a_done_one() {
        let mut ledger = Ledger::default();
        assert!(matches!(
            ledger.claim("k", &params("o", 1), None),
            Claim::Claimed
        ));
        ledger.release("k");
        assert!(matches!(
            ledger.claim("k", &params("o", 1), None),
            Claim::Claimed
        ));
        ledger.create_charge(params("o", 1), Some("k".to_owned()));
        ledger.release("k");
        assert!(matches!(
            ledger.claim("k", &params("o", 1), None),
            Claim::Replay(_)
        ));
    }

    #[test]
    fn a_key_past_its_time_to_live_is_forgotten_and_charges_again() {
        let mut ledger = Ledger::default();
        let hour = Some(Duration::from_secs(3600));
        assert!(matches!(
            ledger.claim("k", &params("o", 1), hour),
            Claim::Claimed
        ));
        let first = ledger.create_charge(params("o", 1), Some("k".to_owned()));
        assert!(matches!(ledger.claim("k", &params("o", 1), hour), Claim::Replay(c) if c == first));
        // With a time to live already over, the same request is a first request again.
        assert!(matches!(
            ledger.claim("k", &params("o", 1), Some(Duration::ZERO)),
            Claim::Claimed
        ));
        let second = ledger.create_charge(params("o", 1), Some("k".to_owned()));
        assert_ne!(first.id, second.id);
        assert_eq!(ledger.charges().len(), 2);
    }

    #[test]
    fn charge_ids_are_sequential() {
        let mut ledger = Ledger::default();
        let first = ledger.create_charge(params("o", 1), None);
        let second = ledger.create_charge(params("o", 1), None);
        assert_eq!(
            (first.id.as_str(), second.id.as_str()),
            ("ch_000001", "ch_000002")
        );
    }

    #[test]
    fn the_webhook_failure_budget_runs_out() {
        let mut ledger = Ledger::default();
        ledger.fail_next_webhooks(2);
        let taken: Vec<bool> = (0..3).map(|_| ledger.take_webhook_failure()).collect();
        assert_eq!(taken, [true, true, false]);
    }
}
