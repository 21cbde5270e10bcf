//! Pieces of the fake API servers the unit tests build with `tower::service_fn` behind a
//! `kube::Client`: a JSON reply, a request's JSON body, a `Status` object.

/// A response with `status` and `body` as `application/json`.
pub(crate) fn json_reply(
    status: u16,
    body: &serde_json::Value,
) -> http::Response<http_body_util::Full<hyper::body::Bytes>> {
    http::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(http_body_util::Full::new(hyper::body::Bytes::from(
            body.to_string(),
        )))
        .expect("a response of a status code, a header and a body")
}

/// The JSON body of `req` (`Null` when it has none or it is not JSON).
pub(crate) async fn json_body(req: http::Request<kube::client::Body>) -> serde_json::Value {
    let bytes = http_body_util::BodyExt::collect(req.into_body())
        .await
        .map(|b| b.to_bytes())
        .unwrap_or_default();
    serde_json::from_slice(&bytes).unwrap_or(serde_json::Value::Null)
}

/// A failure `Status` object with HTTP code `code`, as the API server answers errors.
pub(crate) fn status(code: u16) -> serde_json::Value {
    serde_json::json!({"kind": "Status", "apiVersion": "v1", "status": "Failure",
        "message": "x", "reason": "x", "code": code})
}
