//! The gateway's HTTP routes (actix-web), thin over [`cairn_gateway::Gateway`].
//!
//! | route | key | what |
//! |---|---|---|
//! | `GET /v1/models` | API | the served model |
//! | `POST /v1/chat/completions` | API | chat, non-streaming or SSE (`stream: true`) |
//! | `POST /v1/completions` | API | text or token-id prompts, non-streaming or SSE |
//! | `/episodes/{id}/v1/...` | API | the same three, recorded in episode `{id}` |
//! | `POST /episodes` | control | open an episode: `{"task_id"?, "episode_id"?}` |
//! | `POST /episodes/{id}/reward` | control | `{"reward", "success"?}`; closes the episode |
//! | `POST /episodes/{id}/close` | control | close without a reward |
//! | `GET /episodes/{id}` | control | calls, ids and segments of an episode |
//! | `GET /health` | API | policy version and episode counters |
//! | `POST /tokenize` | API | `{"prompt", "add_special_tokens"?}` → `{"tokens", "count", "max_model_len"}` |
//! | `POST /update_weights_from_disk` | control | `{"model_path", "weight_version"}`: load a trainer's weights from under `weight_roots` (`cairn serve` only; SGLang's route) |
//!
//! The key column is what [`crate::access::guard`] asks when keys are configured (the control
//! key serves every route; [`crate::access::tier`] decides).
//!
//! A call on `/v1/...` with an `X-Cairn-Episode` header belongs to that episode too;
//! `X-Cairn-Anchor` gives the GiGPO anchor key of the turn (or `cairn.anchor` in the body).
//! Every failure is an OpenAI error body with its status. Streams are sent as the ids are
//! sampled; a stream whose client goes away is dropped, its rows stop sampling, and its call
//! is not recorded (the harness never saw it).

use std::convert::Infallible;

use actix_web::http::StatusCode;
use actix_web::web::{self, Bytes};
use actix_web::{HttpRequest, HttpResponse};
use cairn_gateway::{ApiError, ApiErrorKind, Gateway, Route, WeightLoader};
use futures::StreamExt;

use crate::access::BODY_LIMIT;

/// Registers every route on an app holding a `web::Data<Gateway>`.
pub fn configure(cfg: &mut web::ServiceConfig) {
    cfg.route("/v1/models", web::get().to(models))
        .route("/v1/chat/completions", web::post().to(chat))
        .route("/v1/completions", web::post().to(completions))
        .route("/episodes/{id}/v1/models", web::get().to(models))
        .route("/episodes/{id}/v1/chat/completions", web::post().to(chat))
        .route("/episodes/{id}/v1/completions", web::post().to(completions))
        .route("/episodes", web::post().to(open_episode))
        .route("/episodes/{id}", web::get().to(view_episode))
        .route("/episodes/{id}/reward", web::post().to(reward))
        .route("/episodes/{id}/close", web::post().to(close))
        .route("/health", web::get().to(health))
        .route("/tokenize", web::post().to(tokenize))
        .route("/update_weights_from_disk", web::post().to(update_weights))
        .default_service(web::to(unknown_route));
}

fn error(e: &ApiError) -> HttpResponse {
    let status = StatusCode::from_u16(e.status()).unwrap_or(StatusCode::INTERNAL_SERVER_ERROR);
    if status.is_server_error() {
        tracing::warn!(status = status.as_u16(), error = %e.message, "request failed");
    }
    HttpResponse::build(status).json(e.to_json())
}

/// A completion that failed on the server's side (a 503 while shutting down, a backend error):
/// the message names the request, so the harness's log says which call of which episode it
/// was.
fn failed(req: &HttpRequest, episode: Option<&str>, mut e: ApiError) -> HttpResponse {
    if e.status() >= 500 {
        let episode = match episode {
            Some(id) if !req.path().starts_with("/episodes/") => format!(" (episode {id})"),
            _ => String::new(),
        };
        e.message = format!("{} {}{episode}: {}", req.method(), req.path(), e.message);
    }
    error(&e)
}

fn reply(result: Result<serde_json::Value, ApiError>) -> HttpResponse {
    match result {
        Ok(body) => HttpResponse::Ok().json(body),
        Err(e) => error(&e),
    }
}

async fn read_body(mut payload: web::Payload) -> Result<Vec<u8>, ApiError> {
    let mut body = Vec::new();
    while let Some(chunk) = payload.next().await {
        let chunk = chunk.map_err(|e| {
            ApiError::invalid("body", format!("could not read the request body: {e}"))
        })?;
        if body.len() + chunk.len() > BODY_LIMIT {
            return Err(ApiError::new(
                ApiErrorKind::TooLarge,
                format!("the request body is larger than {BODY_LIMIT} bytes"),
            ));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

fn header(req: &HttpRequest, name: &str) -> Option<String> {
    req.headers()
        .get(name)
        .and_then(|v| v.to_str().ok())
        .map(str::to_owned)
}

/// The episode of a call: the `{id}` of the path, else the `X-Cairn-Episode` header.
fn episode_of(req: &HttpRequest) -> Option<String> {
    req.match_info()
        .get("id")
        .map(str::to_owned)
        .or_else(|| header(req, "x-cairn-episode"))
}

async fn models(gw: web::Data<Gateway>) -> HttpResponse {
    HttpResponse::Ok().json(gw.models())
}

async fn chat(req: HttpRequest, payload: web::Payload, gw: web::Data<Gateway>) -> HttpResponse {
    complete(Route::Chat, req, payload, gw).await
}

async fn completions(
    req: HttpRequest,
    payload: web::Payload,
    gw: web::Data<Gateway>,
) -> HttpResponse {
    complete(Route::Completions, req, payload, gw).await
}

async fn complete(
    route: Route,
    req: HttpRequest,
    payload: web::Payload,
    gw: web::Data<Gateway>,
) -> HttpResponse {
    let body = match read_body(payload).await {
        Ok(body) => body,
        Err(e) => return error(&e),
    };
    let episode = episode_of(&req);
    let anchor = header(&req, "x-cairn-anchor");
    let call = match gw.start(route, &body, episode.as_deref(), anchor).await {
        Ok(call) => call,
        Err(e) => return failed(&req, episode.as_deref(), e),
    };
    if !call.job.stream {
        // Dropped with the handler when the client goes away: the sampler then stops its rows.
        let done = match call.finish(&gw).await {
            Ok(done) => done,
            Err(e) => return failed(&req, episode.as_deref(), e),
        };
        let mut body = gw.body(&done);
        if let Some(id) = &episode {
            match gw.record(&done, id) {
                Ok(receipt) => body["cairn"] = receipt,
                Err(e) => return error(&e),
            }
        }
        return HttpResponse::Ok().json(body);
    }
    // Made while sampling; a client that goes away drops it (and its receiver: the sampler
    // stops its rows), and its call is not recorded.
    let events = gw
        .stream(call, episode)
        .map(|piece| Ok::<_, Infallible>(Bytes::from(piece)));
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header(("cache-control", "no-cache"))
        .streaming(events)
}

async fn open_episode(payload: web::Payload, gw: web::Data<Gateway>) -> HttpResponse {
    match read_body(payload).await {
        Ok(body) => reply(gw.open_episode(&body)),
        Err(e) => error(&e),
    }
}

async fn reward(
    id: web::Path<String>,
    payload: web::Payload,
    gw: web::Data<Gateway>,
) -> HttpResponse {
    match read_body(payload).await {
        Ok(body) => reply(gw.reward(&id, &body)),
        Err(e) => error(&e),
    }
}

async fn close(id: web::Path<String>, gw: web::Data<Gateway>) -> HttpResponse {
    reply(gw.close(&id))
}

async fn view_episode(id: web::Path<String>, gw: web::Data<Gateway>) -> HttpResponse {
    reply(gw.view(&id))
}

async fn tokenize(payload: web::Payload, gw: web::Data<Gateway>) -> HttpResponse {
    match read_body(payload).await {
        Ok(body) => reply(gw.tokenize(&body)),
        Err(e) => error(&e),
    }
}

async fn update_weights(
    req: HttpRequest,
    payload: web::Payload,
    gw: web::Data<Gateway>,
    loader: Option<web::Data<WeightLoader>>,
) -> HttpResponse {
    let Some(loader) = loader else {
        return error(&ApiError::new(
            ApiErrorKind::InvalidRequest,
            "this gateway serves a training run's own policy (`cairn train`), which takes no \
             outside weights; load weights into `cairn serve`",
        ));
    };
    match read_body(payload).await {
        Ok(body) => {
            let client = req
                .peer_addr()
                .map_or_else(|| "unknown".to_owned(), |a| a.to_string());
            reply(gw.update_weights(&loader, &body, &client).await)
        }
        Err(e) => error(&e),
    }
}

async fn health(gw: web::Data<Gateway>) -> HttpResponse {
    HttpResponse::Ok().json(gw.health())
}

async fn unknown_route(req: HttpRequest) -> HttpResponse {
    error(&ApiError::not_found(format!(
        "no route {} {}",
        req.method(),
        req.path()
    )))
}
