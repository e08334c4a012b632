//! The dashboard's static files, compiled into the binary.

use actix_web::{web, HttpResponse};

const SCRIPT: &str = include_str!("assets/dashboard.js");
const STYLE: &str = include_str!("assets/dashboard.css");

/// `GET /static/{file}`: `dashboard.js` or `dashboard.css`.
pub async fn serve(file: web::Path<String>) -> HttpResponse {
    let (body, kind) = match file.as_str() {
        "dashboard.js" => (SCRIPT, "text/javascript; charset=utf-8"),
        "dashboard.css" => (STYLE, "text/css; charset=utf-8"),
        _ => return HttpResponse::NotFound().body("no such static file"),
    };
    HttpResponse::Ok()
        .content_type(kind)
        .insert_header(("cache-control", "no-cache"))
        .body(body)
}
