//! Echoes its event with what the Runtime API told it (request id, function ARN,
//! deadline); `{"fail": true}` returns an error, `{"exit": true}` exits mid-call.

use lambda_runtime::{service_fn, Error, LambdaEvent};
use serde::Deserialize;
use serde_json::{json, Value};

#[derive(Deserialize, Default)]
#[serde(default)]
struct Event {
    name: String,
    fail: bool,
    exit: bool,
}

async fn handler(ev: LambdaEvent<Event>) -> Result<Value, Error> {
    let (payload, ctx) = (ev.payload, ev.context);
    if payload.exit {
        std::process::exit(3);
    }
    if payload.fail {
        return Err("asked to fail".into());
    }
    Ok(json!({
        "hello": payload.name,
        "runtime": "rust",
        "request_id": ctx.request_id,
        "function_arn": ctx.invoked_function_arn,
        "function": std::env::var("AWS_LAMBDA_FUNCTION_NAME").unwrap_or_default(),
        "has_deadline": ctx.deadline > 0,
        "handler": std::env::var("_HANDLER").unwrap_or_default(),
    }))
}

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Error> {
    lambda_runtime::run(service_fn(handler)).await
}
