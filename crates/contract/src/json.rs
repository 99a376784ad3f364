//! JSON helpers that keep the TypeScript wire shapes exact.

use serde::{Deserialize, Deserializer, Serialize, Serializer};
use std::collections::BTreeMap;

/// A scalar value of opaque, non-secret adapter metadata.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MetaValue {
    /// A string.
    String(String),
    /// A number (kept as JSON number text so integers and floats round-trip).
    Number(serde_json::Number),
    /// A boolean.
    Bool(bool),
    /// `null`.
    Null,
}

impl From<&str> for MetaValue {
    fn from(value: &str) -> Self {
        MetaValue::String(value.to_owned())
    }
}

impl From<String> for MetaValue {
    fn from(value: String) -> Self {
        MetaValue::String(value)
    }
}

impl From<bool> for MetaValue {
    fn from(value: bool) -> Self {
        MetaValue::Bool(value)
    }
}

impl From<u64> for MetaValue {
    fn from(value: u64) -> Self {
        MetaValue::Number(value.into())
    }
}

impl MetaValue {
    /// The string value, if this is a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            MetaValue::String(value) => Some(value),
            _ => None,
        }
    }
}

/// `map<string, string | number | boolean | null>`: opaque, non-secret adapter state.
pub type Meta = BTreeMap<String, MetaValue>;

/// A field that may be absent, `null`, or a value: `field?: T | null` in TypeScript.
///
/// Use with `#[serde(default, skip_serializing_if = "Nullable::is_absent")]` so an absent
/// field stays absent on the way out.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Nullable<T> {
    /// The key is not present.
    #[default]
    Absent,
    /// The key is present with `null`.
    Null,
    /// The key is present with a value.
    Value(T),
}

impl<T> Nullable<T> {
    /// True when the key is absent.
    pub fn is_absent(&self) -> bool {
        matches!(self, Nullable::Absent)
    }

    /// The value, treating absent and `null` alike.
    pub fn as_option(&self) -> Option<&T> {
        match self {
            Nullable::Value(value) => Some(value),
            _ => None,
        }
    }

    /// Converts into an `Option`, treating absent and `null` alike.
    pub fn into_option(self) -> Option<T> {
        match self {
            Nullable::Value(value) => Some(value),
            _ => None,
        }
    }
}

impl<T> From<Option<T>> for Nullable<T> {
    fn from(value: Option<T>) -> Self {
        match value {
            Some(value) => Nullable::Value(value),
            None => Nullable::Null,
        }
    }
}

impl<T: Serialize> Serialize for Nullable<T> {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        match self {
            Nullable::Value(value) => value.serialize(serializer),
            Nullable::Absent | Nullable::Null => serializer.serialize_none(),
        }
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Nullable<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        Ok(Option::<T>::deserialize(deserializer)?.into())
    }
}

/// Stable JSON: object keys sorted, arrays in order, no whitespace.
///
/// This is the `stableJson` of the TypeScript host (runtime identities, checkpoint metadata).
/// For the ASCII keys the contract uses, byte order equals JS `localeCompare` order.
pub fn stable_json(value: &serde_json::Value) -> String {
    fn sorted(value: &serde_json::Value) -> serde_json::Value {
        match value {
            serde_json::Value::Object(map) => {
                let ordered: BTreeMap<&String, serde_json::Value> = map
                    .iter()
                    .map(|(key, value)| (key, sorted(value)))
                    .collect();
                serde_json::Value::Object(
                    ordered
                        .into_iter()
                        .map(|(key, value)| (key.clone(), value))
                        .collect(),
                )
            }
            serde_json::Value::Array(items) => {
                serde_json::Value::Array(items.iter().map(sorted).collect())
            }
            other => other.clone(),
        }
    }
    // serde_json's default map is a BTreeMap, so serializing the sorted tree is stable.
    serde_json::to_string(&sorted(value)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, PartialEq, Serialize, Deserialize)]
    struct Holder {
        #[serde(default, skip_serializing_if = "Nullable::is_absent")]
        field: Nullable<u32>,
    }

    #[test]
    fn nullable_keeps_absent_null_and_value_apart() {
        for (json, expected) in [
            ("{}", Nullable::Absent),
            (r#"{"field":null}"#, Nullable::Null),
            (r#"{"field":3}"#, Nullable::Value(3)),
        ] {
            let holder: Holder = serde_json::from_str(json).unwrap();
            assert_eq!(holder.field, expected);
            assert_eq!(serde_json::to_string(&holder).unwrap(), json);
        }
    }

    #[test]
    fn stable_json_sorts_keys_recursively() {
        let value = serde_json::json!({"type":"ama_worker","process":{"command":"node","envKeys":[],"args":["w.mjs"]}});
        assert_eq!(
            stable_json(&value),
            r#"{"process":{"args":["w.mjs"],"command":"node","envKeys":[]},"type":"ama_worker"}"#
        );
    }
}
