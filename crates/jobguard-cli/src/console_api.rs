//! The console's JSON API under `/api`, served by `jobguard serve`: find jobs and keys, see a
//! job or a key in full, retry, cancel and delete jobs, pause and resume queues. Every answer
//! comes from [`jobguard::console::Console`], as the `jobguard jobs`, `key` and `queue`
//! commands' do; errors are `{"error": message}` with 400 for bad input, 404 for an unknown
//! job or key, 409 for a job in a state the action does not apply to.
//!
//! Access is [`crate::access`]'s: every write needs the token.

use std::collections::HashMap;

use axum::Json;
use axum::Router;
use axum::extract::{Path, Query, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use jobguard::Backend;
use jobguard::console::{Console, JobFilter, MAX_PAGE};
use jobguard::queue::JobState;
use serde_json::json;

use crate::access::failure;

/// The API's routes, over `console`.
pub fn routes<DB: Backend>(console: Console<DB>) -> Router {
    Router::new()
        .route("/api/jobs", get(jobs::<DB>))
        .route("/api/jobs/{id}", get(job::<DB>).delete(remove::<DB>))
        .route("/api/jobs/{id}/retry", post(retry::<DB>))
        .route("/api/jobs/{id}/cancel", post(cancel::<DB>))
        .route("/api/keys/{*key}", get(key::<DB>))
        .route("/api/queues", get(queues::<DB>))
        .route("/api/schedules", get(schedules::<DB>))
        .route("/api/queues/{name}/pause", post(pause::<DB>))
        .route("/api/queues/{name}/resume", post(resume::<DB>))
        .with_state(console)
}

/// `?state=&kind=&queue=&key=&limit=&before=`, every one optional; empty values are absent.
fn filter(query: &HashMap<String, String>) -> Result<JobFilter, String> {
    let given = |name: &str| {
        query
            .get(name)
            .map(|value| value.trim())
            .filter(|value| !value.is_empty())
    };
    let state = match given("state") {
        None => None,
        Some(state) => Some(match state {
            "available" => JobState::Available,
            "running" => JobState::Running,
            "completed" => JobState::Completed,
            "dead" => JobState::Dead,
            other => {
                return Err(format!(
                    "unknown state `{other}`: use available, running, completed or dead"
                ));
            }
        }),
    };
    let limit = match given("limit") {
        None => 50,
        Some(limit) => limit
            .parse::<u32>()
            .ok()
            .filter(|limit| (1..=MAX_PAGE).contains(limit))
            .ok_or_else(|| format!("limit must be a number from 1 to {MAX_PAGE}"))?,
    };
    let before = match given("before") {
        None => None,
        Some(before) => Some(
            before
                .parse::<i64>()
                .map_err(|_| "before must be a job id: the last id of the previous page")?,
        ),
    };
    Ok(JobFilter {
        state,
        kind: given("kind").map(str::to_owned),
        queue: given("queue").map(str::to_owned),
        key: given("key").map(str::to_owned),
        before,
        limit,
    })
}

/// The answer to a library error: 404, 409, 400, or 500.
fn error(error: jobguard::Error) -> Response {
    let status = match &error {
        jobguard::Error::JobNotFound { .. } => StatusCode::NOT_FOUND,
        jobguard::Error::JobConflict { .. } => StatusCode::CONFLICT,
        jobguard::Error::Key(_) => StatusCode::BAD_REQUEST,
        _ => StatusCode::INTERNAL_SERVER_ERROR,
    };
    failure(status, error.to_string())
}

async fn jobs<DB: Backend>(
    State(console): State<Console<DB>>,
    Query(query): Query<HashMap<String, String>>,
) -> Response {
    let filter = match filter(&query) {
        Ok(filter) => filter,
        Err(message) => return failure(StatusCode::BAD_REQUEST, message),
    };
    match console.jobs(&filter).await {
        Ok(jobs) => {
            // The cursor of the next page, when this one is full.
            let next = (jobs.len() as u32 == filter.limit)
                .then(|| jobs.last().map(|job| job.id))
                .flatten();
            Json(json!({"jobs": jobs, "next_before": next})).into_response()
        }
        Err(e) => error(e),
    }
}

async fn job<DB: Backend>(State(console): State<Console<DB>>, Path(id): Path<i64>) -> Response {
    match console.job(id).await {
        Ok(job) => Json(job).into_response(),
        Err(e) => error(e),
    }
}

async fn key<DB: Backend>(State(console): State<Console<DB>>, Path(key): Path<String>) -> Response {
    match console.key(&key).await {
        Ok(report) if report.guard.is_none() && report.jobs.is_empty() => failure(
            StatusCode::NOT_FOUND,
            format!(
                "no guard row and no job has key `{key}`: it was never enqueued or applied \
                 here, or it was pruned"
            ),
        ),
        Ok(report) => Json(report).into_response(),
        Err(e) => error(e),
    }
}

/// Runs an action on job `id` and answers with the job as it is now (`null` once deleted).
async fn act<DB: Backend>(
    console: &Console<DB>,
    id: i64,
    action: &str,
    done: jobguard::Result<()>,
) -> Response {
    if let Err(e) = done {
        return error(e);
    }
    tracing::info!(job.id = id, action, "job changed from the console");
    let job = match console.job(id).await {
        Ok(job) => json!(job),
        Err(jobguard::Error::JobNotFound { .. }) => serde_json::Value::Null,
        Err(e) => return error(e),
    };
    Json(json!({"id": id, "done": action, "job": job})).into_response()
}

async fn retry<DB: Backend>(State(console): State<Console<DB>>, Path(id): Path<i64>) -> Response {
    let done = console.retry(id).await;
    act(&console, id, "retried", done).await
}

async fn cancel<DB: Backend>(State(console): State<Console<DB>>, Path(id): Path<i64>) -> Response {
    let done = console.cancel(id).await;
    act(&console, id, "cancelled", done).await
}

async fn remove<DB: Backend>(State(console): State<Console<DB>>, Path(id): Path<i64>) -> Response {
    let done = console.delete(id).await;
    act(&console, id, "deleted", done).await
}

async fn queues<DB: Backend>(State(console): State<Console<DB>>) -> Response {
    match console.queues().await {
        Ok(queues) => Json(json!({"queues": queues})).into_response(),
        Err(e) => error(e),
    }
}

async fn schedules<DB: Backend>(State(console): State<Console<DB>>) -> Response {
    match console.schedules().await {
        Ok(schedules) => Json(json!({"schedules": schedules})).into_response(),
        Err(e) => error(e),
    }
}

async fn pause<DB: Backend>(
    State(console): State<Console<DB>>,
    Path(name): Path<String>,
) -> Response {
    match console.pause(&name).await {
        Ok(()) => {
            tracing::info!(queue = name, "queue paused from the console");
            Json(json!({"queue": name, "paused": true})).into_response()
        }
        Err(e) => error(e),
    }
}

async fn resume<DB: Backend>(
    State(console): State<Console<DB>>,
    Path(name): Path<String>,
) -> Response {
    match console.resume(&name).await {
        Ok(()) => {
            tracing::info!(queue = name, "queue resumed from the console");
            Json(json!({"queue": name, "paused": false})).into_response()
        }
        Err(e) => error(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn query(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    #[test]
    fn filters_are_checked_and_empty_ones_are_absent() {
        let all = filter(&query(&[
            ("state", "dead"),
            ("kind", "credit"),
            ("queue", ""),
            ("key", "credit:o-1"),
            ("before", "12"),
            ("limit", "7"),
        ]))
        .unwrap();
        assert_eq!(all.state, Some(JobState::Dead));
        assert_eq!(all.queue, None);
        assert_eq!(all.key.as_deref(), Some("credit:o-1"));
        assert_eq!((all.before, all.limit), (Some(12), 7));
        assert!(
            filter(&query(&[("state", "gone")]))
                .unwrap_err()
                .contains("unknown state")
        );
        assert!(filter(&query(&[("limit", "0")])).is_err());
        assert!(filter(&query(&[("limit", "501")])).is_err());
        assert!(filter(&query(&[("before", "x")])).is_err());
        assert_eq!(filter(&query(&[])).unwrap().limit, 50);
    }
}
