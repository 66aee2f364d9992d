//! The worker's statement on PostgreSQL: completing a job and claiming its key in one round
//! trip, built once per worker from both table names.

use crate::table::TableName;

/// Completes a job and claims its key in one statement, for the worker. The job's row is
/// updated only under the lease that holds it, and the key is claimed only when it was: a
/// fenced worker gets no row back and has claimed nothing. A row whose `claimed` is null means
/// the claim function found the key's row gone (see [`super::guard::claim`]).
pub(crate) fn claim_completing(guard: &TableName, jobs: &TableName) -> String {
    format!(
        "with completed as (
             update {jobs} set state = 'completed', finished_at = now(), leased_until = null
             where id = $5 and lease_token = $6 and state = 'running'
             returning 1
         )
         select c.* from completed left join lateral {claim}($1, $2, $3, $4) c on true",
        jobs = jobs.quoted(),
        claim = guard.derived_qualified("claim"),
    )
}
