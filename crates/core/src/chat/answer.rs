//! A whole Chat Completions answer read straight from its bytes into the few parts the gateway uses: no tree of
//! every field is built and dropped. Shapes are read as leniently as a tree would be: a part of an unexpected
//! type counts as absent, a key given twice keeps its last value.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

/// The parts of an answer the gateway reads.
#[derive(Default)]
pub(super) struct Answer {
    /// The first of `choices`; `None` when there is none (or `choices` is not an array).
    pub(super) choice: Option<Choice>,
    /// `None` when there is no `usage` or it is not an object.
    pub(super) usage: Option<UsageParts>,
}

/// The counts of a `usage` object the gateway reads. A count that is not a whole number of `u64` reads as none,
/// as `Value::as_u64` reads it.
#[derive(Default)]
pub(super) struct UsageParts {
    pub(super) prompt_tokens: Option<u64>,
    pub(super) completion_tokens: Option<u64>,
    pub(super) cached_tokens: Option<u64>,
    pub(super) reasoning_tokens: Option<u64>,
}

/// An answer's first choice.
#[derive(Default)]
pub(super) struct Choice {
    /// `None` when the choice has no `message` at all; a `message` that is not an object reads as an empty one.
    pub(super) message: Option<Message>,
    pub(super) finish_reason: Option<String>,
}

/// The assistant's message of a choice.
#[derive(Default)]
pub(super) struct Message {
    pub(super) content: Option<Value>,
    /// `None` unless `tool_calls` is an array.
    pub(super) tool_calls: Option<Vec<CallParts>>,
}

/// One tool call of a message, as given.
#[derive(Default)]
pub(super) struct CallParts {
    pub(super) id: Option<String>,
    pub(super) name: Option<String>,
    pub(super) arguments: Option<Value>,
}

/// Reads `T`'s shape from any JSON value: reading a `Lenient<Answer>` never fails on a valid JSON document.
pub(super) struct Lenient<T>(pub(super) T);

/// What a part of an answer is read from, by the JSON type found where it is expected; anything it does not read
/// (the other types, and every field it does not name) is skipped and leaves it at its default.
trait Shape<'de>: Default {
    /// Reads one field of an object: `key`'s value is the next value of `map`, and must be taken.
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        let _ = key;
        map.next_value::<IgnoredAny>().map(drop)
    }

    /// Reads an array.
    fn array<A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Self::default())
    }

    /// Reads a string.
    fn text(text: &str) -> Self {
        let _ = text;
        Self::default()
    }

    /// Reads a number that is a whole `u64`.
    fn unsigned(number: u64) -> Self {
        let _ = number;
        Self::default()
    }

    /// What an object starts as, before its fields are read.
    fn object() -> Self {
        Self::default()
    }
}

impl<'de, T: Shape<'de>> Deserialize<'de> for Lenient<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        deserializer.deserialize_any(LenientVisitor(PhantomData))
    }
}

struct LenientVisitor<T>(PhantomData<T>);

impl<'de, T: Shape<'de>> Visitor<'de> for LenientVisitor<T> {
    type Value = Lenient<T>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut value = T::object();
        while let Some(Key(key)) = map.next_key::<Key<'de>>()? {
            value.field(&key, &mut map)?;
        }
        Ok(Lenient(value))
    }

    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        T::array(seq).map(Lenient)
    }

    fn visit_str<E>(self, text: &str) -> Result<Self::Value, E> {
        Ok(Lenient(T::text(text)))
    }

    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(Lenient(T::default()))
    }

    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(Lenient(T::default()))
    }

    fn visit_u64<E>(self, number: u64) -> Result<Self::Value, E> {
        Ok(Lenient(T::unsigned(number)))
    }

    fn visit_f64<E>(self, _: f64) -> Result<Self::Value, E> {
        Ok(Lenient(T::default()))
    }

    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(Lenient(T::default()))
    }

    fn visit_none<E>(self) -> Result<Self::Value, E> {
        Ok(Lenient(T::default()))
    }
}

/// An object's key, borrowed from the answer unless it had escapes.
struct Key<'de>(Cow<'de, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("an object key")
            }

            fn visit_borrowed_str<E>(self, key: &'de str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Borrowed(key)))
            }

            fn visit_str<E>(self, key: &str) -> Result<Self::Value, E> {
                Ok(Key(Cow::Owned(key.to_owned())))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// A string, or `None` for any other JSON.
#[derive(Default)]
struct Text(Option<String>);

impl Shape<'_> for Text {
    fn text(text: &str) -> Self {
        Text(Some(text.to_owned()))
    }
}

/// Reads `key`'s value as `T`'s shape.
fn next<'de, T: Shape<'de>, A: MapAccess<'de>>(map: &mut A) -> Result<T, A::Error> {
    map.next_value::<Lenient<T>>().map(|Lenient(value)| value)
}

impl<'de> Shape<'de> for Answer {
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "choices" => self.choice = next::<FirstChoice, _>(map)?.0,
            "usage" => self.usage = next::<MaybeUsage, _>(map)?.0,
            _ => drop(map.next_value::<IgnoredAny>()?),
        }
        Ok(())
    }
}

/// `usage` when it is an object.
#[derive(Default)]
struct MaybeUsage(Option<UsageParts>);

impl<'de> Shape<'de> for MaybeUsage {
    fn object() -> Self {
        MaybeUsage(Some(UsageParts::default()))
    }

    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        let Some(usage) = &mut self.0 else {
            return map.next_value::<IgnoredAny>().map(drop);
        };
        match key {
            "prompt_tokens" => usage.prompt_tokens = next::<Count, _>(map)?.0,
            "completion_tokens" => usage.completion_tokens = next::<Count, _>(map)?.0,
            "prompt_tokens_details" => {
                usage.cached_tokens = next::<Details, _>(map)?.cached_tokens;
            }
            "completion_tokens_details" => {
                usage.reasoning_tokens = next::<Details, _>(map)?.reasoning_tokens;
            }
            _ => drop(map.next_value::<IgnoredAny>()?),
        }
        Ok(())
    }
}

/// A whole `u64`, or `None` for any other JSON.
#[derive(Default)]
struct Count(Option<u64>);

impl Shape<'_> for Count {
    fn unsigned(number: u64) -> Self {
        Count(Some(number))
    }
}

/// A usage's `*_details`: the counts read of either kind.
#[derive(Default)]
struct Details {
    cached_tokens: Option<u64>,
    reasoning_tokens: Option<u64>,
}

impl<'de> Shape<'de> for Details {
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "cached_tokens" => self.cached_tokens = next::<Count, _>(map)?.0,
            "reasoning_tokens" => self.reasoning_tokens = next::<Count, _>(map)?.0,
            _ => drop(map.next_value::<IgnoredAny>()?),
        }
        Ok(())
    }
}

/// The first element of `choices`.
#[derive(Default)]
struct FirstChoice(Option<Choice>);

impl<'de> Shape<'de> for FirstChoice {
    fn array<A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        let first = seq.next_element::<Lenient<Choice>>()?.map(|Lenient(c)| c);
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(FirstChoice(first))
    }
}

impl<'de> Shape<'de> for Choice {
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "message" => self.message = Some(next(map)?),
            "finish_reason" => self.finish_reason = next::<Text, _>(map)?.0,
            _ => drop(map.next_value::<IgnoredAny>()?),
        }
        Ok(())
    }
}

impl<'de> Shape<'de> for Message {
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "content" => self.content = Some(map.next_value()?),
            "tool_calls" => self.tool_calls = next::<Calls, _>(map)?.0,
            _ => drop(map.next_value::<IgnoredAny>()?),
        }
        Ok(())
    }
}

/// `tool_calls` when it is an array.
#[derive(Default)]
struct Calls(Option<Vec<CallParts>>);

impl<'de> Shape<'de> for Calls {
    fn array<A: SeqAccess<'de>>(mut seq: A) -> Result<Self, A::Error> {
        let mut calls = Vec::new();
        while let Some(Lenient(call)) = seq.next_element::<Lenient<CallParts>>()? {
            calls.push(call);
        }
        Ok(Calls(Some(calls)))
    }
}

impl<'de> Shape<'de> for CallParts {
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "id" => self.id = next::<Text, _>(map)?.0,
            "function" => {
                // A `function` given twice keeps the last, whole.
                let Function { name, arguments } = next(map)?;
                self.name = name;
                self.arguments = arguments;
            }
            _ => drop(map.next_value::<IgnoredAny>()?),
        }
        Ok(())
    }
}

/// A tool call's `function`.
#[derive(Default)]
struct Function {
    name: Option<String>,
    arguments: Option<Value>,
}

impl<'de> Shape<'de> for Function {
    fn field<A: MapAccess<'de>>(&mut self, key: &str, map: &mut A) -> Result<(), A::Error> {
        match key {
            "name" => self.name = next::<Text, _>(map)?.0,
            "arguments" => self.arguments = Some(map.next_value()?),
            _ => drop(map.next_value::<IgnoredAny>()?),
        }
        Ok(())
    }
}
