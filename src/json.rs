//! Describing a JSON value's kind in messages ("must be a string, found a
//! number"), the same words wherever a configuration, a call's overlay or an
//! annotation is checked.

use serde_json::Value;

/// What kind of JSON value `v` is, with its article.
pub fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}
