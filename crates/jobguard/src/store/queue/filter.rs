//! Which jobs a listing takes: the filters of the console's job list and of
//! [`Queue::list`](crate::Queue::list), each combination its own statement.

use super::JobState;
use jobguard_core::sql::LEGACY_RUNNING;

/// The most jobs one page of [`Console::jobs`](crate::console::Console::jobs) returns.
pub const MAX_PAGE: u32 = 500;

/// Which jobs a listing takes ([`Console::jobs`](crate::console::Console::jobs),
/// [`Queue::list`](crate::Queue::list)): every filter given must hold. Newest first (the
/// `running` filter oldest first); `before` pages on by id.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct JobFilter {
    /// Only jobs in this state.
    pub state: Option<JobState>,
    /// Only jobs of this kind.
    pub kind: Option<String>,
    /// Only jobs on this queue.
    pub queue: Option<String>,
    /// Only jobs carrying this key, exactly as stored.
    pub key: Option<String>,
    /// The id of the last job of the previous page: only jobs listed after it (older ones,
    /// or for the `running` filter, which lists oldest first, newer ones).
    pub before: Option<i64>,
    /// How many jobs at most, 1 to [`MAX_PAGE`] (clamped).
    pub limit: u32,
}

impl JobFilter {
    /// The filter's `where` clause, its conditions in a fixed order with numbered parameters
    /// (`$1`...), then the limit's parameter: each combination of filters is its own statement,
    /// so PostgreSQL plans it for the one index that serves it, and never a generic plan that
    /// has to allow for an absent filter.
    ///
    /// `held` is the dialect's condition for the jobs a worker holds (see
    /// [`QueueSql::held`](super::QueueSql)).
    pub(crate) fn clause(&self, held: &str) -> String {
        let mut conditions = Vec::new();
        let mut lease = None;
        let mut next = 1;
        if let Some(state) = self.state {
            // Held and waiting jobs share the stored state `available`: their lease tells
            // them apart. A job a worker of the schema before the lean lease fetched is stored
            // `running` (see `LEGACY_RUNNING`): it is listed with the held ones.
            conditions.push(match state {
                JobState::Running => format!("(state = $1 and {held} or {LEGACY_RUNNING})"),
                _ => "state = $1".to_owned(),
            });
            next += 1;
            lease = match state {
                JobState::Available => Some("leased_until is null"),
                JobState::Running | JobState::Completed | JobState::Dead => None,
            };
        }
        let mut condition = |column: &str, op: &str| {
            conditions.push(format!("{column} {op} ${next}"));
            next += 1;
        };
        if self.kind.is_some() {
            condition("kind", "=");
        }
        if self.queue.is_some() {
            condition("queue", "=");
        }
        if self.key.is_some() {
            condition("job_key", "=");
        }
        // Running jobs are listed oldest first: the jobs held are among the oldest stored
        // `available`, where the dialect's condition finds them; newest first would walk the
        // whole backlog of waiting jobs to find them.
        let oldest_first = self.state == Some(JobState::Running);
        if self.before.is_some() {
            condition("id", if oldest_first { ">" } else { "<" });
        }
        conditions.extend(lease.map(str::to_owned));
        let filter = if conditions.is_empty() {
            String::new()
        } else {
            format!("where {}", conditions.join(" and "))
        };
        let order = if oldest_first { "state, id" } else { "id desc" };
        format!("{filter} order by {order} limit ${next}")
    }

    pub(crate) fn page(&self) -> i64 {
        i64::from(self.limit.clamp(1, MAX_PAGE))
    }
}

#[cfg(test)]
mod tests {
    use super::{JobFilter, JobState, MAX_PAGE};

    #[test]
    fn each_filter_numbers_its_parameter_in_order() {
        let all = JobFilter {
            state: Some(JobState::Dead),
            kind: Some("credit".into()),
            queue: Some("default".into()),
            key: Some("credit:o-1".into()),
            before: Some(10),
            limit: 50,
        };
        assert_eq!(
            all.clause("held"),
            "where state = $1 and kind = $2 and queue = $3 and job_key = $4 and id < $5 \
             order by id desc limit $6"
        );
        let none = JobFilter::default();
        assert_eq!(none.clause("held"), " order by id desc limit $1");
        assert_eq!(none.page(), 1);
        let kind = JobFilter {
            kind: Some("credit".into()),
            limit: 10_000,
            ..JobFilter::default()
        };
        assert_eq!(
            kind.clause("held"),
            "where kind = $1 order by id desc limit $2"
        );
        assert_eq!(kind.page(), i64::from(MAX_PAGE));
        let running = JobFilter {
            state: Some(JobState::Running),
            before: Some(10),
            limit: 5,
            ..JobFilter::default()
        };
        assert_eq!(
            running.clause("lease_is_held"),
            "where (state = $1 and lease_is_held or state = 'running') and id > $2 \
             order by state, id limit $3"
        );
    }
}
