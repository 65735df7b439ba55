//! Parses an AdmissionReview keeping only what the policy reads: the general read `serve` falls
//! back to when its fast read (`wire.rs`) does not accept a review or cannot answer it.
//!
//! A JobSet review is mostly pod templates the mutation never looks at (images, commands,
//! resources, probes, ...). Building a `serde_json::Value` of all of it, a hashed map per object
//! and a `String` per key, would cost more than the mutation (issue 6); this parser skips what a
//! [`Shape`] does not keep, so the tree it builds is small and so is the mutation's working copy.
//!
//! Correctness rests on one rule: the projected document has *exactly* the original's value at
//! every location the shape keeps, and the original's JSON type at every location the shape
//! descends into. A value of another type than the shape expects (a string where an object
//! should be) is kept whole, so the policy's wrong-type errors read the same. The patch is
//! computed from the projection but applies to the user's object: it only names kept locations.
//! `tests/policy` checks that a projected and a fully parsed review give the same answer.

use std::fmt;

use serde::Deserialize as _;
use serde::de::{
    self, DeserializeSeed, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor,
    value::{MapAccessDeserializer, SeqAccessDeserializer},
};
use serde_json::{Map, Number, Value};

/// Which parts of a JSON value to keep.
#[derive(Debug)]
pub enum Shape {
    /// The whole value.
    Keep,
    /// Nothing: the value is skipped (its place is not kept either).
    Skip,
    /// An object: the listed members with their shapes, the others per `rest`. A value that is not
    /// an object is kept whole.
    Object {
        /// Members and their shapes.
        fields: &'static [(&'static str, Shape)],
        /// Shape of every member not listed ([`Shape::Keep`] or [`Shape::Skip`]).
        rest: &'static Shape,
    },
    /// An array whose every element has this shape. A value that is not an array is kept whole.
    Array(&'static Shape),
}

const KEEP: Shape = Shape::Keep;
const SKIP: Shape = Shape::Skip;

/// An object keeping only `fields`.
const fn only(fields: &'static [(&'static str, Shape)]) -> Shape {
    Shape::Object {
        fields,
        rest: &SKIP,
    }
}

/// What the JobSet mutation reads (`mutate.rs`, `crate::mpi::enforce`, and in JobSet mode
/// `crate::mpi::jobset_mode`, which reads the JobSet as `crate::api::JobSet`): the metadata
/// (owner, namespace, label, annotations) and network, and in each replicatedJob its name,
/// replicas, dependencies, template labels, the Job's parallelism and completions, and the pod's
/// volumes and its containers' names, mounts, env and resources.
pub const JOBSET: Shape = only(&[
    ("metadata", KEEP),
    (
        "spec",
        only(&[
            ("network", KEEP),
            (
                "replicatedJobs",
                Shape::Array(&only(&[
                    ("name", KEEP),
                    ("replicas", KEEP),
                    ("dependsOn", KEEP),
                    (
                        "template",
                        only(&[
                            ("metadata", only(&[("labels", KEEP)])),
                            (
                                "spec",
                                only(&[
                                    ("parallelism", KEEP),
                                    ("completions", KEEP),
                                    (
                                        "template",
                                        only(&[(
                                            "spec",
                                            only(&[
                                                ("volumes", KEEP),
                                                (
                                                    "containers",
                                                    Shape::Array(&only(&[
                                                        ("name", KEEP),
                                                        ("volumeMounts", KEEP),
                                                        ("env", KEEP),
                                                        ("resources", KEEP),
                                                    ])),
                                                ),
                                            ]),
                                        )]),
                                    ),
                                ]),
                            ),
                        ]),
                    ),
                ])),
            ),
        ]),
    ),
]);

/// An AdmissionReview whose `request.object` is kept whole (the validating routes read all of
/// it); `request.oldObject` is skipped (no rule reads it) and every other member kept.
pub const WHOLE_OBJECT_REVIEW: Shape = Shape::Object {
    fields: &[(
        "request",
        Shape::Object {
            fields: &[("object", KEEP), ("oldObject", SKIP)],
            rest: &KEEP,
        },
    )],
    rest: &KEEP,
};

/// An AdmissionReview whose `request.object` is kept whole and of whose `request.oldObject` only
/// the metadata is kept (the JobSet validation compares the old label and annotations).
pub const OLD_METADATA_REVIEW: Shape = Shape::Object {
    fields: &[(
        "request",
        Shape::Object {
            fields: &[("object", KEEP), ("oldObject", only(&[("metadata", KEEP)]))],
            rest: &KEEP,
        },
    )],
    rest: &KEEP,
};

/// An AdmissionReview whose `request.object` is a JobSet projected onto [`JOBSET`]; otherwise as
/// [`WHOLE_OBJECT_REVIEW`].
pub const JOBSET_REVIEW: Shape = Shape::Object {
    fields: &[(
        "request",
        Shape::Object {
            fields: &[("object", JOBSET), ("oldObject", SKIP)],
            rest: &KEEP,
        },
    )],
    rest: &KEEP,
};

/// Parses `bytes` as one JSON value projected onto `shape`, with `serde_json::from_slice`'s
/// errors (syntax, trailing characters, depth limit).
///
/// # Errors
/// The bytes are not one JSON value.
pub fn from_slice(shape: &Shape, bytes: &[u8]) -> serde_json::Result<Value> {
    let mut deserializer = serde_json::Deserializer::from_slice(bytes);
    let value = Projected(shape).deserialize(&mut deserializer)?;
    deserializer.end()?;
    Ok(value)
}

/// A seed producing the projection of one value.
struct Projected<'s>(&'s Shape);

impl<'de> DeserializeSeed<'de> for Projected<'_> {
    type Value = Value;

    fn deserialize<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        match self.0 {
            Shape::Keep => Value::deserialize(deserializer),
            Shape::Skip => {
                IgnoredAny::deserialize(deserializer)?;
                Ok(Value::Null)
            }
            shape => deserializer.deserialize_any(ProjectedVisitor(shape)),
        }
    }
}

/// Visits an object or array shape; any other JSON type is kept as it is.
struct ProjectedVisitor<'s>(&'s Shape);

impl<'de> Visitor<'de> for ProjectedVisitor<'_> {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("any valid JSON value")
    }

    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }

    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::Number(v.into()))
    }

    fn visit_f64<E>(self, v: f64) -> Result<Value, E> {
        Ok(Number::from_f64(v).map_or(Value::Null, Value::Number))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_owned()))
    }

    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }

    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }

    fn visit_some<D: Deserializer<'de>>(self, deserializer: D) -> Result<Value, D::Error> {
        Projected(self.0).deserialize(deserializer)
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let Shape::Array(element) = self.0 else {
            return Value::deserialize(SeqAccessDeserializer::new(seq));
        };
        let mut items = Vec::with_capacity(seq.size_hint().unwrap_or(0));
        while let Some(item) = seq.next_element_seed(Projected(element))? {
            items.push(item);
        }
        Ok(Value::Array(items))
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let Shape::Object { fields, rest } = self.0 else {
            return Value::deserialize(MapAccessDeserializer::new(map));
        };
        let mut members = Map::new();
        while let Some(key) = map.next_key::<String>()? {
            let shape = fields
                .iter()
                .find_map(|(name, shape)| (*name == key).then_some(shape))
                .unwrap_or(rest);
            if matches!(shape, Shape::Skip) {
                map.next_value::<IgnoredAny>()?;
            } else {
                let value = map.next_value_seed(Projected(shape))?;
                members.insert(key, value);
            }
        }
        Ok(Value::Object(members))
    }
}
