//! The answers every dashboard page shares: the HTML response, the page frame around a body
//! (200) or a "not found" message (404), the run a query names, and the link to a run's page.

use actix_web::HttpResponse;

use super::html::{escape, page, query_value};
use super::runs::{self, Run};
use super::Dashboard;

/// A page answer with its status.
pub fn html(status: actix_web::http::StatusCode, body: String) -> HttpResponse {
    HttpResponse::build(status)
        .content_type("text/html; charset=utf-8")
        .insert_header(("cache-control", "no-store"))
        .body(body)
}

/// A 404 page saying what was not found and where to look.
pub fn not_found(d: &Dashboard, message: &str) -> HttpResponse {
    let body = format!(
        r#"<h1>Not found</h1><p class="error">{}</p>"#,
        escape(message)
    );
    html(
        actix_web::http::StatusCode::NOT_FOUND,
        page(&d.base, "not found", &body, d.gateway.is_some()),
    )
}

pub fn ok_page(d: &Dashboard, title: &str, body: &str) -> HttpResponse {
    html(
        actix_web::http::StatusCode::OK,
        page(&d.base, title, body, d.gateway.is_some()),
    )
}

/// The run named `name` under the dashboard's root, or why there is none.
pub fn lookup(d: &Dashboard, name: &str) -> Result<Run, String> {
    let runs = runs::discover(&d.root).map_err(|e| format!("{e:#}"))?;
    runs.into_iter().find(|r| r.name == name).ok_or_else(|| {
        format!(
            "no run `{name}` under {}; the run list shows the runs",
            d.root.display()
        )
    })
}

/// `/run?run=NAME` of a run.
pub fn run_link(d: &Dashboard, run: &Run) -> String {
    format!(
        r#"<a href="{}/run?run={}">{}</a>"#,
        d.base,
        query_value(&run.name),
        escape(&run.name)
    )
}
