//! One event of a trace as its JSON writes it, before any sense is made of
//! it: the numbers (a JSON number, or text holding one: [`Num`]), the
//! process and thread ids (a number or text: [`Id`]), text that may be
//! anything ([`Text`]), and the fields of an event and of its `args` that
//! reading needs ([`RawEvent`], [`RawArgs`]). Everything else an event
//! holds is skipped as it is read.
//!
//! May use: serde, nothing of the diagnosis: what an event means is
//! `kineto`'s and `course`'s to say.

use serde::de::{Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
use std::fmt;

/// A number as a trace may write it: a JSON number, or a string holding
/// one ("N/A" where Kineto had none).
#[derive(Clone, Debug, PartialEq)]
pub(super) enum Num {
    Value(f64),
    Text(String),
    /// A list, an object or a boolean.
    Other,
}

impl fmt::Display for Num {
    /// As the trace wrote it: `12.5`, `"soon"`, or what it was instead.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Num::Value(v) => write!(f, "{v}"),
            Num::Text(t) => write!(f, "\"{t}\""),
            Num::Other => f.write_str("a list, an object or a boolean"),
        }
    }
}

impl Num {
    pub(super) fn value(&self) -> Option<f64> {
        match self {
            Num::Value(v) => Some(*v),
            Num::Text(t) => t.trim().parse().ok(),
            Num::Other => None,
        }
    }
}

impl<'de> Deserialize<'de> for Num {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Num, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = Num;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a number")
            }
            fn visit_u64<E>(self, v: u64) -> std::result::Result<Num, E> {
                Ok(Num::Value(v as f64))
            }
            fn visit_i64<E>(self, v: i64) -> std::result::Result<Num, E> {
                Ok(Num::Value(v as f64))
            }
            fn visit_f64<E>(self, v: f64) -> std::result::Result<Num, E> {
                Ok(Num::Value(v))
            }
            fn visit_str<E>(self, v: &str) -> std::result::Result<Num, E> {
                Ok(Num::Text(v.to_string()))
            }
            fn visit_bool<E>(self, _: bool) -> std::result::Result<Num, E> {
                Ok(Num::Other)
            }
            fn visit_unit<E>(self) -> std::result::Result<Num, E> {
                Ok(Num::Other)
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> std::result::Result<Num, A::Error> {
                while seq.next_element::<IgnoredAny>()?.is_some() {}
                Ok(Num::Other)
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> std::result::Result<Num, A::Error> {
                while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
                Ok(Num::Other)
            }
        }
        d.deserialize_any(V)
    }
}

/// A process or thread id: a number, or text (Kineto's "Spans", the
/// `"stream 7"` of old traces).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Id(pub(super) String);

impl<'de> Deserialize<'de> for Id {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Id, D::Error> {
        match Num::deserialize(d)? {
            Num::Value(v) if v.fract() == 0.0 && v.abs() < 9e15 => Ok(Id(format!("{}", v as i64))),
            Num::Value(v) => Ok(Id(v.to_string())),
            Num::Text(t) => Ok(Id(t)),
            Num::Other => Ok(Id(String::new())),
        }
    }
}

impl Id {
    /// The number it holds: `7` of `7`, `"7"` or `"stream 7"`.
    pub(super) fn number(&self) -> Option<u64> {
        self.0.trim().trim_start_matches("stream").trim().parse().ok()
    }
}

/// Text where a trace may put anything (`args.name` of a metadata event).
#[derive(Clone, Debug, PartialEq)]
pub(super) struct Text(pub(super) Option<String>);

impl<'de> Deserialize<'de> for Text {
    fn deserialize<D: Deserializer<'de>>(d: D) -> std::result::Result<Text, D::Error> {
        Ok(Text(match Num::deserialize(d)? {
            Num::Text(t) => Some(t),
            Num::Value(v) => Some(v.to_string()),
            Num::Other => None,
        }))
    }
}

/// The `args` of an event, as far as reading needs them.
#[derive(Deserialize, Default)]
pub(super) struct RawArgs {
    pub(super) device: Option<Num>,
    /// A peer copy's device (Kineto writes `fromDevice`, `inDevice`, `toDevice`).
    #[serde(rename = "inDevice")]
    pub(super) in_device: Option<Num>,
    pub(super) stream: Option<Num>,
    pub(super) correlation: Option<Num>,
    pub(super) bytes: Option<Num>,
    /// A CUDA sync event's: the stream the awaited event was recorded on.
    pub(super) wait_on_stream: Option<Num>,
    /// A CUDA sync event's: the correlation id of the call that recorded the awaited event.
    pub(super) wait_on_cuda_event_record_corr_id: Option<Num>,
    /// A CUDA sync event's: CUPTI's id of the awaited event.
    pub(super) wait_on_cuda_event_id: Option<Num>,
    /// A metadata event's name (`process_name`, `thread_name`).
    pub(super) name: Option<Text>,
    /// An NCCL kernel's message: its elements (one rank's part)...
    #[serde(rename = "In msg nelems")]
    pub(super) in_msg_nelems: Option<Num>,
    /// ...and their type ("Float", "BFloat16").
    pub(super) dtype: Option<Text>,
}

/// One entry of `traceEvents`, as far as reading needs it.
#[derive(Deserialize, Default)]
#[serde(expecting = "an event object")]
pub(super) struct RawEvent {
    pub(super) ph: Option<Text>,
    pub(super) cat: Option<Text>,
    pub(super) name: Option<Text>,
    pub(super) pid: Option<Id>,
    pub(super) tid: Option<Id>,
    pub(super) ts: Option<Num>,
    pub(super) dur: Option<Num>,
    pub(super) args: Option<RawArgs>,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn numbers_and_ids_read_as_traces_write_them() {
        assert_eq!(Id("stream 7".into()).number(), Some(7));
        assert_eq!(Id("7".into()).number(), Some(7));
        assert_eq!(Id("Spans".into()).number(), None);
        assert_eq!(serde_json::from_str::<Num>("\"N/A\"").unwrap().value(), None);
        assert_eq!(serde_json::from_str::<Num>("12.5").unwrap().value(), Some(12.5));
        assert_eq!(serde_json::from_str::<Num>("[1, 2]").unwrap(), Num::Other);
    }
}
