//! What the JobSet mutation reads of a JobSet, borrowed from its JSON text in one pass (the
//! review's): the metadata as raw JSON (read into `ObjectMeta` by the route, so that a malformed
//! one is a denial naming the field), and at every level the policy writes to, whether the level
//! is there, missing (absent or `null`) or of another JSON type than it should be. Reading a
//! JobSet this way cannot fail on valid JSON.
//!
//! A value of the wrong type is not a read error: it is recorded with its type, so that the
//! mutation can refuse to write there and name the field ([`super::MutationError`]), and only if
//! it has to write there. List entries are kept as raw JSON: the mutation reads an entry's key,
//! and the whole entry only when its key is one the policy writes.

use std::borrow::Cow;
use std::fmt;
use std::marker::PhantomData;

use serde::de::{self, Deserialize, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde_json::value::RawValue;

/// A JSON type, as Go names it in a field error.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JsonType {
    /// `null`.
    Null,
    /// `true` or `false`.
    Boolean,
    /// A number.
    Number,
    /// A string.
    String,
    /// An array.
    Array,
    /// An object.
    Object,
}

impl JsonType {
    /// The type of a valid JSON text, told by its first character.
    pub fn of_text(text: &str) -> Self {
        match text.trim_start().bytes().next() {
            Some(b'n') => JsonType::Null,
            Some(b't' | b'f') => JsonType::Boolean,
            Some(b'"') => JsonType::String,
            Some(b'[') => JsonType::Array,
            Some(b'{') => JsonType::Object,
            _ => JsonType::Number,
        }
    }

    /// The type's name: `array`.
    pub fn name(self) -> &'static str {
        self.quoted().trim_matches('"')
    }

    /// The type's name in quotes, as a field error shows it: `"array"`.
    pub fn quoted(self) -> &'static str {
        match self {
            JsonType::Null => "\"null\"",
            JsonType::Boolean => "\"boolean\"",
            JsonType::Number => "\"number\"",
            JsonType::String => "\"string\"",
            JsonType::Array => "\"array\"",
            JsonType::Object => "\"object\"",
        }
    }
}

/// A member of an object, expected to hold a `T` (an object or an array, per the wrapper).
#[derive(Debug, Default)]
pub enum Slot<T> {
    /// Absent or `null`: the policy adds it where it writes below it.
    #[default]
    Missing,
    /// Present, of the expected type.
    Present(T),
    /// Present, of another type: the policy cannot write below it.
    Wrong(JsonType),
}

/// The JobSet, as far as the mutation reads it.
#[derive(Debug, Default)]
pub struct JobSetView<'a> {
    /// The metadata, as raw JSON (`None` when absent or `null`).
    pub metadata: Option<&'a RawValue>,
    pub(super) spec: Slot<Spec<'a>>,
}

#[derive(Debug, Default)]
pub(super) struct Spec<'a> {
    pub replicated_jobs: Slot<Vec<Element<ReplicatedJob<'a>>>>,
    pub startup_policy: Slot<StartupPolicy<'a>>,
}

/// `spec.startupPolicy`: JobSet refuses `dependsOn` next to `startupPolicyOrder: InOrder`.
#[derive(Debug, Default)]
pub(super) struct StartupPolicy<'a> {
    pub startup_policy_order: Name<'a>,
}

/// A value read as an object of type `T`, or, when it is not an object, its JSON type.
#[derive(Debug)]
pub enum Element<T> {
    /// A JSON object.
    Object(T),
    /// Any other JSON value.
    Other(JsonType),
}

#[derive(Debug, Default)]
pub(super) struct ReplicatedJob<'a> {
    pub name: Name<'a>,
    pub depends_on: Set,
    pub template: Slot<JobTemplate<'a>>,
}

#[derive(Debug, Default)]
pub(super) struct JobTemplate<'a> {
    pub spec: Slot<JobSpec<'a>>,
}

#[derive(Debug, Default)]
pub(super) struct JobSpec<'a> {
    pub parallelism: Count,
    pub completions: Count,
    pub template: Slot<PodTemplate<'a>>,
}

#[derive(Debug, Default)]
pub(super) struct PodTemplate<'a> {
    pub spec: Slot<PodSpec<'a>>,
}

#[derive(Debug, Default)]
pub(super) struct PodSpec<'a> {
    pub volumes: Slot<Vec<&'a RawValue>>,
    pub init_containers: Slot<Vec<&'a RawValue>>,
    pub containers: Slot<Vec<Element<Container<'a>>>>,
}

#[derive(Debug, Default)]
pub(super) struct Container<'a> {
    pub name: Name<'a>,
    pub volume_mounts: Slot<Vec<&'a RawValue>>,
    pub env: Slot<Vec<&'a RawValue>>,
    pub command: Set,
    pub args: Set,
    pub readiness_probe: Set,
}

/// A member JobSet mode only fills in when the user left it unset: whether it holds a value
/// (absent or `null` is unset; any other value, of any type, is the user's and stays).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) struct Set(pub bool);

/// A `name` member: the name when it is a string, none otherwise (an entry with a name of
/// another type has no name the policy looks for).
#[derive(Debug, Default)]
pub(super) struct Name<'a>(pub Option<Cow<'a, str>>);

impl Name<'_> {
    pub fn as_deref(&self) -> Option<&str> {
        self.0.as_deref()
    }
}

/// Visits answered by the JSON type alone: each listed visit (`unit`, `none`, `bool`, `i64`,
/// `u64`, `f64`, `str`, `seq`, `map`) goes to [`TypeOf`], which drains arrays and objects, and its
/// answer is mapped by `$map`. A visitor lists the visits it has no other answer for.
macro_rules! by_type {
    ($value:ty, $map:expr; $($visit:ident)+) => {
        $(by_type!(@$visit $value, $map);)+
    };
    (@unit $value:ty, $map:expr) => {
        fn visit_unit<E: de::Error>(self) -> Result<$value, E> {
            TypeOf.visit_unit().map($map)
        }
    };
    (@none $value:ty, $map:expr) => {
        fn visit_none<E: de::Error>(self) -> Result<$value, E> {
            TypeOf.visit_none().map($map)
        }
    };
    (@bool $value:ty, $map:expr) => {
        fn visit_bool<E: de::Error>(self, v: bool) -> Result<$value, E> {
            TypeOf.visit_bool(v).map($map)
        }
    };
    (@i64 $value:ty, $map:expr) => {
        fn visit_i64<E: de::Error>(self, v: i64) -> Result<$value, E> {
            TypeOf.visit_i64(v).map($map)
        }
    };
    (@u64 $value:ty, $map:expr) => {
        fn visit_u64<E: de::Error>(self, v: u64) -> Result<$value, E> {
            TypeOf.visit_u64(v).map($map)
        }
    };
    (@f64 $value:ty, $map:expr) => {
        fn visit_f64<E: de::Error>(self, v: f64) -> Result<$value, E> {
            TypeOf.visit_f64(v).map($map)
        }
    };
    (@str $value:ty, $map:expr) => {
        fn visit_str<E: de::Error>(self, v: &str) -> Result<$value, E> {
            TypeOf.visit_str(v).map($map)
        }
    };
    (@seq $value:ty, $map:expr) => {
        fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<$value, A::Error> {
            TypeOf.visit_seq(seq).map($map)
        }
    };
    (@map $value:ty, $map:expr) => {
        fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<$value, A::Error> {
            TypeOf.visit_map(map).map($map)
        }
    };
}

impl<'de: 'a, 'a> Deserialize<'de> for Name<'a> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct NameVisitor;
        impl<'de> Visitor<'de> for NameVisitor {
            type Value = Option<Cow<'de, str>>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Self::Value, E> {
                Ok(Some(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(Some(Cow::Owned(v.to_owned())))
            }
            by_type!(Option<Cow<'de, str>>, |_| None; unit none bool i64 u64 f64 seq map);
        }
        deserializer.deserialize_any(NameVisitor).map(Name)
    }
}

/// `parallelism` or `completions`: what the policy compares its count with.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub(super) enum Count {
    /// Absent or `null`.
    #[default]
    Missing,
    /// An integer that fits an `i64`.
    Integer(i64),
    /// Anything else (a float, a string, ...): never the count.
    Other,
}

impl Count {
    fn of_type(found: JsonType) -> Self {
        match found {
            JsonType::Null => Count::Missing,
            _ => Count::Other,
        }
    }
}

impl<'a> JobSetView<'a> {
    /// Reads a JobSet from its JSON text.
    ///
    /// # Errors
    /// serde_json's error for text that is not a JSON object.
    pub fn read(text: &'a str) -> serde_json::Result<Self> {
        serde_json::from_str(text)
    }
}

/// An object member's name, borrowed from the text unless it holds an escape.
struct Key<'a>(Cow<'a, str>);

impl<'de> Deserialize<'de> for Key<'de> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct KeyVisitor;
        impl<'de> Visitor<'de> for KeyVisitor {
            type Value = Key<'de>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a member name")
            }
            fn visit_borrowed_str<E: de::Error>(self, v: &'de str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Borrowed(v)))
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Key<'de>, E> {
                Ok(Key(Cow::Owned(v.to_owned())))
            }
        }
        deserializer.deserialize_str(KeyVisitor)
    }
}

/// What a view expects at a [`Slot`]: an object (the view structs) or an array (`Vec`).
pub(super) trait Shape {
    /// `true` for an array.
    const ARRAY: bool;
}

impl<T> Shape for Vec<T> {
    const ARRAY: bool = true;
}

/// Implements `Deserialize` for a view struct read from a JSON object: the listed members by
/// name, every other member skipped, and a repeated member's last value kept, as a JSON object
/// (and the reference mutation's `serde_json::Value`) keeps it.
macro_rules! object_view {
    ($type:ident { $($name:literal => $field:ident),* $(,)? }) => {
        impl Shape for $type<'_> {
            const ARRAY: bool = false;
        }

        impl<'de: 'a, 'a> Deserialize<'de> for $type<'a> {
            fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                struct ViewVisitor<'a>(PhantomData<&'a ()>);
                impl<'de: 'a, 'a> Visitor<'de> for ViewVisitor<'a> {
                    type Value = $type<'a>;

                    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                        f.write_str("a JSON object")
                    }

                    fn visit_map<M: MapAccess<'de>>(
                        self,
                        mut map: M,
                    ) -> Result<Self::Value, M::Error> {
                        let mut view = $type::default();
                        while let Some(key) = map.next_key::<Key<'de>>()? {
                            match key.0.as_ref() {
                                $($name => view.$field = map.next_value()?,)*
                                _ => {
                                    map.next_value::<IgnoredAny>()?;
                                }
                            }
                        }
                        Ok(view)
                    }
                }
                deserializer.deserialize_map(ViewVisitor(PhantomData))
            }
        }
    };
}

object_view!(JobSetView { "metadata" => metadata, "spec" => spec });
object_view!(Spec {
    "replicatedJobs" => replicated_jobs,
    "startupPolicy" => startup_policy,
});
object_view!(StartupPolicy { "startupPolicyOrder" => startup_policy_order });
object_view!(ReplicatedJob {
    "name" => name,
    "dependsOn" => depends_on,
    "template" => template,
});
object_view!(JobTemplate { "spec" => spec });
object_view!(JobSpec {
    "parallelism" => parallelism,
    "completions" => completions,
    "template" => template,
});
object_view!(PodTemplate { "spec" => spec });
object_view!(PodSpec {
    "volumes" => volumes,
    "initContainers" => init_containers,
    "containers" => containers,
});
object_view!(Container {
    "name" => name,
    "volumeMounts" => volume_mounts,
    "env" => env,
    "command" => command,
    "args" => args,
    "readinessProbe" => readiness_probe,
});

/// Visits any JSON value and reports its type, draining arrays and objects.
struct TypeOf;

impl<'de> Visitor<'de> for TypeOf {
    type Value = JsonType;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any JSON value")
    }
    fn visit_unit<E: de::Error>(self) -> Result<JsonType, E> {
        Ok(JsonType::Null)
    }
    fn visit_none<E: de::Error>(self) -> Result<JsonType, E> {
        Ok(JsonType::Null)
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<JsonType, E> {
        Ok(JsonType::Boolean)
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<JsonType, E> {
        Ok(JsonType::Number)
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<JsonType, E> {
        Ok(JsonType::Number)
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<JsonType, E> {
        Ok(JsonType::Number)
    }
    fn visit_str<E: de::Error>(self, _: &str) -> Result<JsonType, E> {
        Ok(JsonType::String)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<JsonType, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(JsonType::Array)
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<JsonType, A::Error> {
        while map.next_entry::<IgnoredAny, IgnoredAny>()?.is_some() {}
        Ok(JsonType::Object)
    }
}

impl<T> Slot<T> {
    fn of_type(found: JsonType) -> Self {
        match found {
            JsonType::Null => Slot::Missing,
            other => Slot::Wrong(other),
        }
    }
}

impl<'de, T: Deserialize<'de> + Shape> Deserialize<'de> for Slot<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SlotVisitor<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de> + Shape> Visitor<'de> for SlotVisitor<T> {
            type Value = Slot<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            by_type!(Slot<T>, Slot::of_type; unit none bool i64 u64 f64 str);
            fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Slot<T>, A::Error> {
                if T::ARRAY {
                    T::deserialize(de::value::SeqAccessDeserializer::new(seq)).map(Slot::Present)
                } else {
                    TypeOf.visit_seq(seq).map(Slot::Wrong)
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Slot<T>, A::Error> {
                if T::ARRAY {
                    TypeOf.visit_map(map).map(Slot::Wrong)
                } else {
                    T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Slot::Present)
                }
            }
        }
        deserializer.deserialize_any(SlotVisitor(PhantomData))
    }
}

impl<'de, T: Deserialize<'de>> Deserialize<'de> for Element<T> {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct ElementVisitor<T>(PhantomData<T>);
        impl<'de, T: Deserialize<'de>> Visitor<'de> for ElementVisitor<T> {
            type Value = Element<T>;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            by_type!(Element<T>, Element::Other; unit none bool i64 u64 f64 str seq);
            fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<Element<T>, A::Error> {
                T::deserialize(de::value::MapAccessDeserializer::new(map)).map(Element::Object)
            }
        }
        deserializer.deserialize_any(ElementVisitor(PhantomData))
    }
}

impl<'de> Deserialize<'de> for Set {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct SetVisitor;
        impl<'de> Visitor<'de> for SetVisitor {
            type Value = Set;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            by_type!(Set, |found| Set(found != JsonType::Null); unit none bool i64 u64 f64 str seq map);
        }
        deserializer.deserialize_any(SetVisitor)
    }
}

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct CountVisitor;
        impl<'de> Visitor<'de> for CountVisitor {
            type Value = Count;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("any JSON value")
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Count, E> {
                Ok(Count::Integer(v))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Count, E> {
                Ok(i64::try_from(v).map_or(Count::Other, Count::Integer))
            }
            by_type!(Count, Count::of_type; unit none bool f64 str seq map);
        }
        deserializer.deserialize_any(CountVisitor)
    }
}

/// The string member `key` of the JSON object `entry` (its last value, were it repeated); none
/// when `entry` is not an object or the member is absent or not a string.
pub(super) fn member_string<'a>(entry: &'a RawValue, key: &str) -> Option<Cow<'a, str>> {
    struct MemberVisitor<'k>(&'k str);
    impl<'de, 'k> Visitor<'de> for MemberVisitor<'k> {
        type Value = Option<Cow<'de, str>>;

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str("any JSON value")
        }
        by_type!(Option<Cow<'de, str>>, |_| None; unit none bool i64 u64 f64 str seq);
        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut found = None;
            while let Some(key) = map.next_key::<Key<'de>>()? {
                if key.0 == self.0 {
                    found = map.next_value::<Name<'de>>()?.0;
                } else {
                    map.next_value::<IgnoredAny>()?;
                }
            }
            Ok(found)
        }
    }
    let mut deserializer = serde_json::Deserializer::from_str(entry.get());
    deserializer
        .deserialize_any(MemberVisitor(key))
        .ok()
        .flatten()
}
